"""purax.core: the pure functions and the state. Imports nothing else of purax.

Its names are bound on first use (:func:`purax.core.lazy.attach`): importing
``purax.core.errors`` (the command line's parser does) imports no jax.
"""

from purax.core import lazy as _lazy

__getattr__, __dir__ = _lazy.attach(__name__, {
    'guards': 'purax.core.guards',
    'loops': 'purax.core.loops',
    'losses': 'purax.core.losses',
    'metrics': 'purax.core.metrics',
    'objectives': 'purax.core.objectives',
    'optimizers': 'purax.core.optimizers',
    'pbt': 'purax.core.pbt',
    'population': 'purax.core.population',
    'ConfigError': 'purax.core.errors:ConfigError',
    'ContractError': 'purax.core.errors:ContractError',
    'DataError': 'purax.core.errors:DataError',
    'OutOfMemoryError': 'purax.core.errors:OutOfMemoryError',
    'PuraxError': 'purax.core.errors:PuraxError',
    'Functions': 'purax.core.model:Functions',
    'Linen': 'purax.core.model:Linen',
    'Model': 'purax.core.model:Model',
    'NNX': 'purax.core.model:NNX',
    'as_model': 'purax.core.model:as_model',
    'loss_function': 'purax.core.objectives:loss_function',
    'adamw': 'purax.core.optim:adamw',
    'hparams': 'purax.core.hparams',
    'hyperparams': 'purax.core.hparams:get',
    'set_hyperparams': 'purax.core.hparams:set',
    'warmup_cosine': 'purax.core.optim:warmup_cosine',
    'Population': 'purax.core.population:Population',
    'SpikeGuard': 'purax.core.spikes:SpikeGuard',
    'TrainState': 'purax.core.state:TrainState',
    'Task': 'purax.core.task:Task',
}, deprecated={
    # Moved to purax.inspect in 0.3 (so did the modules summary, flops, nonfinite
    # and intercept: their old paths are aliases, below).
    'find_nonfinite': ('purax:find_nonfinite', 'purax.find_nonfinite', '0.4'),
})

# Moved to purax.inspect in 0.3: the old module paths import the new modules,
# with a DeprecationWarning, until 0.4.
for _old, _new in (('summary', 'summary'), ('flops', 'flops'), ('nonfinite', 'nan'),
                   ('intercept', 'intercept')):
  _lazy.moved(f'purax.core.{_old}', f'purax.inspect.{_new}')
