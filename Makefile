# Two commands do all the set-up on a fresh machine; each makes and uses .venv.
#   make train   trains the default CNN on scikit-learn's digits (CPU, ~15 s; the first run installs .venv, ~1-2 min)
#   make test    runs the test suite (what CI runs)
#   make docs    builds the documentation site into docs/_build/html (Sphinx; fails on any warning)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: train test bench docs venv clean

# ml_dtypes < 0.7: 0.7.0 takes 1.2 s to import (jax imports it), 0.6.0 0.14 s; every
# purax process pays it, and the test suite starts over a hundred (jax needs >= 0.5).
$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,test]' 'ml_dtypes<0.7'
	$(BIN)/python -m pip install --quiet --no-deps 'jax2onnx>=0.17.1,<0.18'   # see setup.cfg [onnx]
	touch $@

venv: $(BIN)/.installed

train: $(BIN)/.installed
	$(BIN)/purax train $(ARGS)

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 $(ARGS)

docs: $(BIN)/.installed
	$(BIN)/python docs/build.py

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/step_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis docs/_build
