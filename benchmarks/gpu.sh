#!/bin/sh
# Every GPU measurement of purax in one call, for a timed device lease.
#
#   sh benchmarks/gpu.sh              # results in $OUT (or benchmarks/results)
#
# Runs from the repository root under the machine's own python3 and the
# packages there (jax with CUDA, flax, optax, orbax, numpy, scikit-learn);
# nothing is downloaded. The Python packages the image lacks (grain, tyro and
# their needs) travel as wheels in .whl/ and are installed into a folder on
# PYTHONPATH before this runs (README, "GPU"); carry no flax: this repository's
# pinned flax does not import under the image's newer jax. Order: what the
# open targets need first.
#   1. benchmarks/lm.py: GPT-2 small and 1.3B, purax vs hand-written flax
#      (cuDNN, then XLA attention), MFU, temp memory, compile time 4 vs 48
#      layers, then purax with the layers unrolled; it writes its JSON after
#      every measurement and starts none after LM_BUDGET_S seconds (default:
#      45% of TOTAL_S).
#   2. benchmarks/population.py: K members vmapped vs sequential.
#   3. benchmarks/step_overhead.py: the small CNN (and MLP) with many steps per
#      call vs the tutorial loop that reads the loss every step (JSON after
#      each model).
#   4. benchmarks/memory.py --time: remat/microbatch memory, bf16 vs fp32 step.
# All output is kept in $OUT/gpu.log (2 and 4 write their JSON at the end).
# TOTAL_S bounds the whole script (default 520 s: a 600 s device call).
set -u
OUT=${OUT:-benchmarks/results}
TOTAL_S=${TOTAL_S:-520}
LM_BUDGET_S=${LM_BUDGET_S:-$(( TOTAL_S * 45 / 100 ))}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - start) )); }
# run NAME SECONDS_KEPT_FOR_LATER CMD...: CMD under a timeout of what is left
# minus SECONDS_KEPT_FOR_LATER, its output appended to $OUT/gpu.log (one log:
# a device call brings back few files); skipped under 30 s.
run() {
  name=$1 keep=$2; shift 2
  t=$(( $(left) - keep ))
  if [ "$t" -lt 30 ]; then
    echo "gpu.sh: $name skipped: ${t}s left" | tee -a "$OUT/gpu.log"
    return
  fi
  echo "== $name: $*" >>"$OUT/gpu.log"
  timeout "$t" "$@" >>"$OUT/gpu.log" 2>&1
  echo "gpu.sh: $name exit $? after $(( $(date +%s) - start ))s" | tee -a "$OUT/gpu.log"
  tail -n 12 "$OUT/gpu.log"
}

mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$OUT/gpu.log" 2>&1
run jax 0 $PY -c 'import jax, flax, optax, orbax.checkpoint, purax; print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, jax.devices())'
run lm_gpu 200 $PY benchmarks/lm.py --budget-s "$LM_BUDGET_S" \
  --variants purax,flax_cudnn,flax_xla,purax_unrolled --out "$OUT/lm_gpu.json"
run population_gpu 140 $PY benchmarks/population.py --out "$OUT/population_gpu.json"
run step_overhead_gpu 45 $PY benchmarks/step_overhead.py --trials 3 --out "$OUT/step_overhead_gpu.json"
run memory_gpu 5 $PY benchmarks/memory.py --time --out "$OUT/memory_gpu.json"
echo "gpu.sh: $(( $(date +%s) - start ))s; results in $OUT"
