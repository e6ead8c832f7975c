#!/bin/sh
# The large-model GPU measurement of purax in one timed call (issue 33).
#
#   sh benchmarks/gpu.sh                 # on the GPU machine; results in $OUT
#   GPU_SMOKE=1 sh benchmarks/gpu.sh     # the same steps at tiny sizes, any machine
#
# Runs from the repository root under the machine's own python3 and its
# packages (jax with CUDA, flax, optax, orbax, numpy); nothing is downloaded.
# The packages the GPU image lacks (grain, tyro and their needs) travel as
# wheels in .whl/ (carried with the working tree: benchmarks/README.md, "GPU")
# and are installed here into a folder on PYTHONPATH; carry no flax: this
# repository's pinned flax does not import under the image's newer jax.
#
# In order, most-needed first, each under a timeout of what is left:
#   1. benchmarks/lm.py: GPT-2 small (124M: 12 layers, seq 1024, batch 16)
#      and 1.3B (24 layers, seq 2048, batch 8) in bfloat16: purax by default
#      and the hand-written flax + optax loop with cuDNN attention at both
#      shapes, then purax with float8 matmuls (purax_fp8) at both, then the
#      diagnostics at GPT-2 small (no guard, the hand-written loss, the
#      chunked loss); MFU, temporary memory, compile time, the compiled
#      program's op counts (conditionals: 0 expected for purax on a GPU). It
#      writes its JSON after every measurement and starts none after
#      LM_BUDGET_S seconds. Then, from its JSON, purax_fp8's cuBLASLt float8
#      GEMMs against its float8 dots (12 a layer; skipped off the GPU).
#   2. benchmarks/lm_memory.py --config gpt2: the step's temporary memory with
#      full logits and with the chunked loss, on the device.
#   3. with GPU_EXTRAS=1 only: population.py, step_overhead.py, memory.py --time
#      (issue 28's measurements, if time is left).
# Files in $OUT (a device call brings back at most 8): gpu.log (all output),
# lm_gpu.json, lm_memory_gpu.json (and with GPU_EXTRAS the three extras').
# TOTAL_S bounds the whole script (default 540 s: a 600 s device call).
set -u
OUT=${OUT:-benchmarks/results}
TOTAL_S=${TOTAL_S:-540}
LM_BUDGET_S=${LM_BUDGET_S:-$(( TOTAL_S * 70 / 100 ))}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if [ "${GPU_SMOKE:-0}" = 1 ]; then
  CONFIGS=tiny DIAG_CONFIG=tiny MEMORY_CONFIG=tiny MEMORY_CHUNKS=64 STEPS=2 TRIALS=1
  VARIANTS=purax,flax_cudnn,purax_fp8,flax_xla,purax_noguard,purax_plain_loss,purax_chunked
else
  CONFIGS=gpt2,1.3b DIAG_CONFIG=gpt2 MEMORY_CONFIG=gpt2 MEMORY_CHUNKS=1024,4096 STEPS=10 TRIALS=3
  VARIANTS=purax,flax_cudnn,purax_fp8
fi
start=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - start) )); }
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
# run NAME SECONDS_KEPT_FOR_LATER CMD...: CMD under a timeout of what is left
# minus SECONDS_KEPT_FOR_LATER, its output appended to $LOG; skipped under 20 s.
run() {
  name=$1 keep=$2; shift 2
  t=$(( $(left) - keep ))
  if [ "$t" -lt 20 ]; then
    echo "gpu.sh: $name skipped: ${t}s left" | tee -a "$LOG"
    return
  fi
  echo "== $name (timeout ${t}s): $*" >>"$LOG"
  timeout "$t" "$@" >>"$LOG" 2>&1
  echo "gpu.sh: $name exit $? after $(( $(date +%s) - start ))s" | tee -a "$LOG"
  tail -n 14 "$LOG"
}

# The wheels the image lacks, into a folder of their own (no network: --no-index).
if ls .whl/*.whl >/dev/null 2>&1; then
  SITE=${SITE:-/tmp/purax-site}
  $PY -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$LOG" 2>&1
run versions 0 $PY -c 'import jax, flax, optax, purax; print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, jax.devices())'

# 1. The comparison, then float8, at both shapes; the diagnostics at GPT-2 small.
run lm 60 $PY benchmarks/lm.py --config "$CONFIGS" --variants "$VARIANTS" --no-depth \
  --interleave no --steps "$STEPS" --trials "$TRIALS" --budget-s "$LM_BUDGET_S" \
  --out "$OUT/lm_gpu.json"
# Whether XLA:GPU kept purax_fp8's float8 dots as cuBLASLt float8 GEMMs: 4
# matmuls a layer, each 1 forward + 2 backward dots (tests/nn/test_fp8.py
# counts them in the CUDA-lowered program on the CPU); skipped off the GPU.
$PY - "$OUT/lm_gpu.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
try:
  r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
  sys.exit(f'fp8 GEMMs: no lm_gpu.json ({e})')
for name, entry in r.get('configs', {}).items():
  m = entry.get('purax_fp8')
  if r.get('platform') != 'gpu' or not isinstance(m, dict) or 'float8_gemms' not in m:
    print(f'fp8 GEMMs {name}: skipped (platform {r.get("platform")}, purax_fp8 '
          f'{"measured" if isinstance(m, dict) and "float8_gemms" in m else "not measured"})')
    continue
  want = 12 * entry['shape']['layers']
  got = m['float8_gemms']
  print(f'fp8 GEMMs {name}: {got} __cublas$lt$matmul$f8 for {want} float8 dots'
        + ('' if got == want else ': XLA upcast the rest (compute capability < 8.9?)'))
EOF
if [ "${GPU_SMOKE:-0}" != 1 ]; then
  run lm_diagnostics 60 $PY benchmarks/lm.py --config "$DIAG_CONFIG" --no-depth \
    --variants purax_noguard,purax_plain_loss,purax_chunked --interleave no \
    --steps "$STEPS" --trials "$TRIALS" --out "$OUT/lm_gpu_diagnostics.json"
fi
# 2. The chunked loss's memory on the device.
run lm_memory 5 $PY benchmarks/lm_memory.py --config "$MEMORY_CONFIG" --chunks "$MEMORY_CHUNKS" \
  --out "$OUT/lm_memory_gpu.json"
# 3. Issue 28's measurements, when asked for.
if [ "${GPU_EXTRAS:-0}" = 1 ]; then
  run population 60 $PY benchmarks/population.py --out "$OUT/population_gpu.json"
  run step_overhead 30 $PY benchmarks/step_overhead.py --trials 3 --out "$OUT/step_overhead_gpu.json"
  run memory 5 $PY benchmarks/memory.py --time --out "$OUT/memory_gpu.json"
fi
echo "gpu.sh: $(( $(date +%s) - start ))s; results in $OUT" | tee -a "$LOG"
