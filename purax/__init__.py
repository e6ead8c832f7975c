"""purax: a pure-functional, minimal training core for JAX.

The pure functions live on :class:`purax.Task` (``init``, ``step``,
``evaluate``, ``predict``) over an explicit :class:`purax.TrainState`; a model
is any :mod:`purax.core.model` (flax.linen, Flax NNX, plain functions,
Equinox) and a loss any function of :mod:`purax.core.objectives`' contract;
:func:`purax.fit` is the host loop; ``purax train`` the command line.
Importing purax touches no device, and imports jax only when a name below is
first used (:func:`purax.core.lazy.attach`), so ``purax --help`` needs none.
"""

from purax.core import lazy as _lazy

__version__ = '0.3.0'

_PUBLIC = {
    'core': 'purax.core',
    'io': 'purax.io',
    'nn': 'purax.nn',
    'ConfigError': 'purax.core.errors:ConfigError',
    'ContractError': 'purax.core.errors:ContractError',
    'DataError': 'purax.core.errors:DataError',
    'OutOfMemoryError': 'purax.core.errors:OutOfMemoryError',
    'Functions': 'purax.core.model:Functions',
    'Linen': 'purax.core.model:Linen',
    'Model': 'purax.core.model:Model',
    'NNX': 'purax.core.model:NNX',
    'SpikeGuard': 'purax.core.spikes:SpikeGuard',
    'Task': 'purax.core.task:Task',
    'TrainState': 'purax.core.state:TrainState',
    'adamw': 'purax.core.optim:adamw',
    'hyperparams': 'purax.core.hparams:get',
    'set_hyperparams': 'purax.core.hparams:set',
    'find_nonfinite': 'purax.inspect.nan:find',
    'loss_function': 'purax.core.objectives:loss_function',
    'metrics': 'purax.core.metrics',
    'objectives': 'purax.core.objectives',
    'summary': 'purax.inspect.summary:summary',
    'Checkpointer': 'purax.io.checkpoint:Checkpointer',
    'restore_or_init': 'purax.resume:restore_or_init',
    'hooks': 'purax.hooks',
    'plan': 'purax.plan',
    'StopOnSignal': 'purax.io.signals:StopOnSignal',
    'evaluate': 'purax.loop:evaluate',
    'fit': 'purax.loop:fit',
    'fork': 'purax.core.branching:fork',
    'open_run': 'purax.app.saved_run:open_run',
}
__getattr__, __dir__ = _lazy.attach(__name__, _PUBLIC)
#: The public names (each bound on first use).
__all__ = sorted(_PUBLIC)
