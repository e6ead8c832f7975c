"""purax.io: data sets, grain pipelines, device prefetch, metric writers, checkpoints.

Its names are bound on first use (:func:`purax.core.lazy.attach`): importing
``purax.io.signals`` (the command line does) imports no jax.
"""

from purax.core import lazy as _lazy

__getattr__, __dir__ = _lazy.attach(__name__, {
    'checkpoint': 'purax.io.checkpoint',
    'datasets': 'purax.io.datasets',
    'pipeline': 'purax.io.pipeline',
    'writers': 'purax.io.writers',
})
