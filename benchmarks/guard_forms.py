"""The non-finite guard's forms, one jitted training step each, against the hand-written step.

Every variant is ``jax.jit((state, metrics, batch) -> (state, metrics),
donate_argnums=(0, 1))`` over the same list of numpy batches (digits, batch
64), the metrics merged on the device as ``fit`` does; only the update's
guard (or the accuracy metric) differs. The variants run interleaved over
the trials and the median steps/s of each, and the median of each trial's
ratio to the hand-written step, are written as JSON. Nothing is asserted.

- ``purax``: :meth:`purax.Task.step` as shipped: the update under one
  ``lax.cond`` (skipped: the fields as they were), zeroed metrics of a
  skipped step and two counters.
- ``no_guard``: ``Task(skip_nonfinite=False)``.
- ``cond_only``: the ``lax.cond`` without the zeroed metrics and counters.
- ``select``: the update always computed, ``jnp.where(finite, new, old)``
  over params, optimizer state and model state.
- ``select_updates``: params ``where(finite, p + u, p)``, the optimizer and
  model state selected as in ``select``.
- ``argmax_accuracy``: ``purax`` with the accuracy computed by ``jnp.argmax``
  (what :func:`purax.core.losses.top1_correct` replaced).
- ``carried``: ``purax``, with the state's scalar leaves (the step, the
  optimizer's counts and injected hyperparameters) and the PRNG key's data
  packed into one uint32 array between calls and unpacked inside the step
  (:func:`scalar_packing`; bit-preserving, checked at the start): what a
  state of fewer arrays would save per call (30 arrays become 20 for the
  MLP with :func:`purax.adamw`, as many as the hand-written step's).
- ``handwritten``: ``benchmarks/step_overhead.py``'s flax+optax step (loss
  only, no metrics, no guard).

Usage: ``python benchmarks/guard_forms.py [--model mlp] [--steps 600] [--trials 11] [--out PATH]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import purax  # noqa: E402
from purax.app.models import get_model  # noqa: E402
from purax.core import metrics as metrics_lib  # noqa: E402
from purax.core import objectives, optim, update  # noqa: E402
from purax.io import datasets, pipeline  # noqa: E402
from purax.io.checkpoint import layout  # noqa: E402
from step_overhead import handwritten_step, handwritten_tx  # noqa: E402
from jsonout import write_json  # noqa: E402  (beside this script)


def _selected(loss_fn, tx, state, batch, settings, *, params_by_update: bool):
  """A guard by ``jnp.where`` over the new and old fields (the forms ``select*``)."""
  grads, metrics, model_state = update.gradients(loss_fn, state, batch, settings=settings)
  metrics = dict(metrics)
  grad_norm = optim.global_norm(grads)
  metrics['grad_norm'] = metrics_lib.Average.of(grad_norm)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics['loss'].total)
  updates, opt_state = tx.update(grads, state.opt_state, state.params, grad_norm=grad_norm)
  select = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
  if params_by_update:
    params = jax.tree.map(lambda p, u: jnp.where(finite, p + u.astype(p.dtype), p),
                          state.params, updates)
  else:
    params = select(optax.apply_updates(state.params, updates), state.params)
  metrics = jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), metrics)
  metrics['skipped'] = metrics_lib.Sum.of(~finite)
  metrics['skip_streak'] = metrics_lib.Streak.of(~finite)
  return state.replace(step=state.step + 1, params=params,
                       opt_state=select(opt_state, state.opt_state),
                       model_state=select(model_state, state.model_state)), metrics


def _cond_only(loss_fn, tx, state, batch, settings):
  grads, metrics, model_state = update.gradients(loss_fn, state, batch, settings=settings)
  metrics = dict(metrics)
  grad_norm = optim.global_norm(grads)
  metrics['grad_norm'] = metrics_lib.Average.of(grad_norm)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics['loss'].total)

  def updated(state):
    updates, opt_state = tx.update(grads, state.opt_state, state.params, grad_norm=grad_norm)
    return optax.apply_updates(state.params, updates), opt_state, model_state

  params, opt_state, model_state = jax.lax.cond(
      finite, updated, lambda s: (s.params, s.opt_state, s.model_state), state)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                       model_state=model_state), metrics


@purax.loss_function(hparams={'label_smoothing': 0.0})
def _argmax_classification(logits, batch, hparams):
  values, weight, _ = objectives.classification(logits, batch, hparams)
  return values, weight, {'accuracy': (jnp.argmax(logits, -1) == batch['y']).astype(jnp.float32)}


def steppers(task):
  """``name -> (state, batch) -> (state, metrics)`` of the purax forms."""
  loss, tx, settings = task._train_loss, task.tx, task.settings   # pylint: disable=protected-access
  return {
      'purax': task.step,
      'no_guard': dataclasses.replace(task, skip_nonfinite=False).step,
      'cond_only': lambda s, b: _cond_only(loss, tx, s, b, settings),
      'select': lambda s, b: _selected(loss, tx, s, b, settings, params_by_update=False),
      'select_updates': lambda s, b: _selected(loss, tx, s, b, settings, params_by_update=True),
      'argmax_accuracy': dataclasses.replace(task, loss=_argmax_classification).step,
  }


def scalar_packing(state):
  """``(pack, unpack)`` for states shaped like ``state``: ``pack(state)`` is
  ``(other leaves, uint32 [n])`` with every scalar float32 / int32 / uint32
  leaf bitcast into the array, and every PRNG key's data; ``unpack`` inverts
  it bit for bit. Both traceable."""
  leaves, treedef = jax.tree.flatten(state)
  packed = [layout.is_typed_key(x) or (x.shape == () and x.dtype in (jnp.float32, jnp.int32, jnp.uint32))
            for x in leaves]

  def words(x):
    if layout.is_typed_key(x):
      return jax.random.key_data(x).ravel()
    return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(1)

  def pack(state):
    leaves = jax.tree.leaves(state)
    return ([x for x, p in zip(leaves, packed) if not p],
            jnp.concatenate([words(x) for x, p in zip(leaves, packed) if p]))

  def unpack(carried):
    rest, array = carried
    rest, out, at = iter(rest), [], 0
    for like, p in zip(leaves, packed):
      if not p:
        out.append(next(rest))
      elif layout.is_typed_key(like):
        data = jax.random.key_data(like)
        out.append(jax.random.wrap_key_data(array[at:at + data.size].reshape(data.shape),
                                            impl=jax.random.key_impl(like)))
        at += data.size
      else:
        out.append(jax.lax.bitcast_convert_type(array[at], like.dtype))
        at += 1
    return jax.tree.unflatten(treedef, out)

  return pack, unpack


def _bits(tree) -> list:
  """``tree``'s leaves on the host, keys as their data, to compare bit for bit."""
  return [np.asarray(x) for x in jax.tree.leaves(layout.storable(tree))]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='mlp')
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--trials', type=int, default=11)
  parser.add_argument('--out', default='benchmarks/results/guard_forms.json')
  args = parser.parse_args()
  ds = datasets.load('digits')
  task = purax.Task(model=get_model(args.model, num_classes=10),
                    tx=purax.adamw(learning_rate=2e-3, total_steps=args.steps, warmup_steps=50))
  data = pipeline.train_dataset(ds.x_train, ds.y_train, batch_size=64, seed=0,
                                num_steps=args.steps)
  batches = [data[s] for s in range(args.steps)]

  def timed(step, state, carry):
    state, carry = step(state, carry, batches[0])            # compiled before the clock
    jax.block_until_ready(carry)
    start = time.perf_counter()
    for batch in batches:
      state, carry = step(state, carry, batch)
    jax.block_until_ready(state)
    return len(batches) / (time.perf_counter() - start)

  def purax_variant(fn):
    step = jax.jit(lambda s, a, b: metrics_lib.stepped(fn, s, a, b), donate_argnums=(0, 1))

    def run():
      state = task.init(jax.random.key(0), batches[0])
      return timed(step, state, metrics_lib.zeros_of(lambda s, b: fn(s, b)[1], state,
                                                     batches[0]))
    return run

  def carried_variant(fn):
    pack, unpack = scalar_packing(task.init(jax.random.key(0), batches[0]))

    def packed_step(carried, acc, batch):
      state, acc = metrics_lib.stepped(fn, unpack(carried), acc, batch)
      return pack(state), acc
    step = jax.jit(packed_step, donate_argnums=(0, 1))

    def start():
      state = task.init(jax.random.key(0), batches[0])
      return (jax.jit(pack)(state),
              metrics_lib.zeros_of(lambda s, b: fn(s, b)[1], state, batches[0]))

    # The same training, bit for bit: ten steps each way.
    state = task.init(jax.random.key(0), batches[0])
    carried, acc_c = start()
    acc = jax.tree.map(jnp.copy, acc_c)
    plain = jax.jit(lambda s, a, b: metrics_lib.stepped(fn, s, a, b))
    for batch in batches[:10]:
      state, acc = plain(state, acc, batch)
      carried, acc_c = step(carried, acc_c, batch)
    assert all(np.array_equal(a, b) for a, b in zip(_bits(state), _bits(jax.jit(unpack)(carried))))
    assert all(np.array_equal(a, b) for a, b in zip(_bits(acc), _bits(acc_c)))
    return lambda: timed(step, *start())

  tx = handwritten_tx(args.steps)
  hand = handwritten_step(task.model, tx)

  def run_hand():
    params = task.init(jax.random.key(0), batches[0]).params
    step = lambda p_o, _, b: (lambda p, o, loss: ((p, o), loss))(*hand(*p_o, b))  # noqa: E731
    return timed(step, (params, tx.init(params)), None)

  variants = {name: purax_variant(fn) for name, fn in steppers(task).items()}
  variants['carried'] = carried_variant(task.step)
  variants['handwritten'] = run_hand
  runs = {name: [] for name in variants}
  order = list(variants)
  for trial in range(args.trials):
    for name in order[trial % len(order):] + order[:trial % len(order)]:
      runs[name].append(variants[name]())
  result = {
      'model': args.model, 'steps': args.steps, 'trials': args.trials,
      'platform': jax.devices()[0].platform, 'cpu_count': os.cpu_count(), 'jax': jax.__version__,
      'steps_per_sec_median': {k: statistics.median(v) for k, v in runs.items()},
      'paired_vs_handwritten': {k: statistics.median(x / h for x, h in
                                                     zip(v, runs['handwritten']))
                                for k, v in runs.items()},
      'paired_vs_no_guard': {k: statistics.median(x / h for x, h in zip(v, runs['no_guard']))
                             for k, v in runs.items()},
      'steps_per_sec_all': runs,
  }
  print(json.dumps({k: {n: round(x, 3) for n, x in result[k].items()}
                    for k in ('steps_per_sec_median', 'paired_vs_handwritten',
                              'paired_vs_no_guard')}, indent=1))
  write_json(args.out, result)


if __name__ == '__main__':
  main()
