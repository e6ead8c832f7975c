"""purax.core: the pure functions and the state. Imports nothing else of purax."""

from purax.core import flops as flops
from purax.core import losses as losses
from purax.core import metrics as metrics
from purax.core import pbt as pbt
from purax.core import population as population
from purax.core.errors import ConfigError as ConfigError
from purax.core.errors import DataError as DataError
from purax.core.errors import PuraxError as PuraxError
from purax.core.optim import adamw as adamw
from purax.core.optim import set_hyperparams as set_hyperparams
from purax.core.optim import warmup_cosine as warmup_cosine
from purax.core.population import Population as Population
from purax.core.state import TrainState as TrainState
from purax.core.task import Task as Task
