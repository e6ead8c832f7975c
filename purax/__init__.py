"""purax: a pure-functional, minimal training core for JAX.

The pure functions live on :class:`purax.Task` (``init``, ``step``,
``evaluate``, ``predict``) over an explicit :class:`purax.TrainState`; a model
is any :mod:`purax.core.model` (flax.linen, Flax NNX, plain functions,
Equinox) and a loss any function of :mod:`purax.core.objectives`' contract;
:func:`purax.fit` is the host loop; ``purax train`` the command line.
Importing purax touches no device.
"""

from purax import core as core
from purax import io as io
from purax import nn as nn
from purax.core import ConfigError as ConfigError
from purax.core import ContractError as ContractError
from purax.core import DataError as DataError
from purax.core import OutOfMemoryError as OutOfMemoryError
from purax.core import Functions as Functions
from purax.core import Linen as Linen
from purax.core import Model as Model
from purax.core import NNX as NNX
from purax.core import SpikeGuard as SpikeGuard
from purax.core import Task as Task
from purax.core import TrainState as TrainState
from purax.core import adamw as adamw
from purax.core import hyperparams as hyperparams
from purax.core import set_hyperparams as set_hyperparams
from purax.core import find_nonfinite as find_nonfinite
from purax.core import loss_function as loss_function
from purax.core import metrics as metrics
from purax.core import objectives as objectives
from purax.core.summary import summary as summary
from purax.io.checkpoint import Checkpointer as Checkpointer
from purax.io.checkpoint.run import restore_or_init as restore_or_init
from purax import hooks as hooks
from purax import plan as plan
from purax.io.signals import StopOnSignal as StopOnSignal
from purax.loop import evaluate as evaluate
from purax.loop import fit as fit

__version__ = '0.2.0'
