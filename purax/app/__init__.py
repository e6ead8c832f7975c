"""The application layer: the ``purax`` command and the runs it makes.

Everything here is a client of the public API (:mod:`purax`): configs in
sections (:mod:`~purax.app.config`), the tables of models
(:mod:`~purax.app.models`), data sets (:mod:`~purax.app.data`) and
hyperparameters (:mod:`~purax.app.hparam_table`), the job a config builds
(:mod:`~purax.app.job`), the run directory (:mod:`~purax.app.rundir`),
``train``/``eval``/``export``/``generate`` (:mod:`~purax.app.runs`), sweeps
(:mod:`~purax.app.sweep`, :mod:`~purax.app.search`, :mod:`~purax.app.report`),
plots, ``--dry-run`` and the entry point (:mod:`~purax.app.cli`). Nothing under
``purax.core``, ``nn``, ``parallel`` or ``io`` imports it.
"""

from purax.core import lazy as _lazy

# Renamed in 0.3 (no two modules of one file name): the old import paths still work.
_lazy.moved('purax.app.hparams', 'purax.app.hparam_table')
_lazy.moved('purax.app.optimizers', 'purax.app.optimizer_table')
_lazy.moved('purax.app.memory', 'purax.app.fit_memory')
