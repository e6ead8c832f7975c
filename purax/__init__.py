"""purax: a pure-functional, minimal training core for JAX.

The pure functions live on :class:`purax.Task` (``init``, ``loss``, ``step``,
``evaluate``) over an explicit :class:`purax.TrainState`; :func:`purax.fit` is
the host loop; ``purax train`` the command line. Importing purax touches no
device.
"""

from purax import core as core
from purax import io as io
from purax import nn as nn
from purax.core import ConfigError as ConfigError
from purax.core import DataError as DataError
from purax.core import Task as Task
from purax.core import TrainState as TrainState
from purax.core import adamw as adamw
from purax.core import metrics as metrics
from purax.loop import evaluate as evaluate
from purax.loop import fit as fit

__version__ = '0.1.0'
