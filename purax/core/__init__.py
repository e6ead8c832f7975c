"""purax.core: the pure functions and the state. Imports nothing else of purax."""

from purax.core import flops as flops
from purax.core import loops as loops
from purax.core import losses as losses
from purax.core import metrics as metrics
from purax.core import objectives as objectives
from purax.core import pbt as pbt
from purax.core import population as population
from purax.core.errors import ConfigError as ConfigError
from purax.core.errors import ContractError as ContractError
from purax.core.errors import DataError as DataError
from purax.core.errors import OutOfMemoryError as OutOfMemoryError
from purax.core.errors import PuraxError as PuraxError
from purax.core.model import Functions as Functions
from purax.core.model import Linen as Linen
from purax.core.model import Model as Model
from purax.core.model import NNX as NNX
from purax.core.model import as_model as as_model
from purax.core.objectives import loss_function as loss_function
from purax.core.optim import adamw as adamw
from purax.core import hparams as hparams
from purax.core.hparams import get as hyperparams
from purax.core.hparams import set as set_hyperparams
from purax.core.optim import warmup_cosine as warmup_cosine
from purax.core.population import Population as Population
from purax.core.state import TrainState as TrainState
from purax.core.task import Task as Task
