#!/usr/bin/env bash
# Every GPU check of issues 29 and 31 in one run, for a lent GPU session:
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh [STAGE ...]   # the device: $OUT is set for you
#   bash benchmarks/gpu_check.sh --tests-only                 # `make gpu-test`: the pytest part only
#
# Stages, in this order, each under its own `timeout` (seconds; measured on an H100 on
# 2026-11-27 where given), all of them when none is named:
#   tests     the GPU tests (pytest -m gpu over the files below)                100 (52 there)
#   truth     benchmarks/gpu_truth.py: the doctor names each planted GPU cause
#             first, then the tune verifies its fix (the doctor runs all come
#             first; rerun what a cut left out with --only NAME)                420 (320 did not reach the last fix)
#   mfu       benchmarks/gpu_mfu.py: gpt at GPT-2 124M, bf16 + compile + fused
#             AdamW, batch 64 x 1024 ($MFU_VARIANTS adds experiments)            110 (56 there)
#   recipes   benchmarks/gpu_recipes.py: the other recipes' fast variants' MFU  150
#   overhead  benchmarks/gpu_overhead.py: Trainer, Monitor and doctor over a
#             hand-written GPT-2 124M loop                                      200
# All five take about 16 minutes at most, more than a lent session's 15 of device time: name
# the stages a session needs. One that fails or times out does not stop the others, and this
# run's results files are copied to $OUT after each stage, so a run cut short still brings
# back what it measured. No virtual environment and no package index are needed:
# PYTHONPATH=src and the machine's python3 (torch with CUDA). Output goes to
# $OUT/gpu_check.log, the results files to $OUT (at most 8 files in all). A stage past its
# timeout gets SIGINT (Python stops its child runs), SIGKILL 10 s later. Without CUDA it says
# so, runs the tests (which skip), gpu_truth.py --dry-run on two scripts and gpu_overhead.py
# --small (the wiring), and skips the rest.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/gpu-check-XXXX)}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TRAINSPEED_MACHINE=${TRAINSPEED_MACHINE:-}
[ -z "$TRAINSPEED_MACHINE" ] && unset TRAINSPEED_MACHINE

GPU_TESTS="tests/test_gpu_paths.py tests/test_gpu_doctor.py tests/telemetry/test_memory.py
  tests/telemetry/test_env.py tests/telemetry/test_peaks.py tests/engine/test_precision.py
  tests/engine/data/test_data_prefetch.py tests/engine/checkpoint/test_ckpt_async.py
  tests/recipes/test_gpt_attention_order.py"
ALL_STAGES="tests truth mfu recipes overhead"

# The GPU tests, for --tests-only and the tests stage. -v: each result on its own line as it
# comes, so a run cut by the timeout still shows them.
# shellcheck disable=SC2206 # the file list is word-split on purpose
PYTEST_GPU=("$PY" -m pytest -v -m gpu -p no:cacheprovider -o addopts="-ra" --durations=5 $GPU_TESTS)

if [ "${1:-}" = "--tests-only" ]; then
  timeout -s INT -k 10 300 "${PYTEST_GPU[@]}"
  exit $?
fi
STAGES=${*:-$ALL_STAGES}
for s in $STAGES; do
  case " $ALL_STAGES " in *" $s "*) ;; *) echo "gpu_check: unknown stage '$s'; stages: $ALL_STAGES" >&2; exit 2 ;; esac
done

STAMP=$(mktemp)  # results files written after this are this run's
copy_results() {
  # this run's results files so far into $OUT (at most 6: the log and room to spare make 8)
  local n=0 f
  for f in benchmarks/results/gpu_*.json; do
    [ -f "$f" ] && [ "$f" -nt "$STAMP" ] && [ "$n" -lt 6 ] || continue
    cp "$f" "$OUT/" && n=$((n + 1))
  done
}

cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
status=0
# stage NAME SECONDS COMMAND...: run it under its timeout if it was asked for, report, copy results
stage() {
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo; echo "== $name (timeout $seconds s)"
  timeout -s INT -k 10 "$seconds" "$@" || { echo "$name: exit $?"; status=1; }
  echo "$name: $((SECONDS - t0)) s"
  copy_results
}
{
  echo "== gpu_check $(date -u +%FT%TZ) on $(hostname): python $("$PY" -V 2>&1 | cut -d' ' -f2), torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1); stages: $STAGES"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import pynvml" 2>/dev/null && echo "pynvml: yes (GPU busy from NVML)" || echo "pynvml: no (no GPU busy figure)"
  "$PY" -c "import libcst" 2>/dev/null && echo "libcst: yes" || echo "libcst: no (the tune's code change is skipped)"
  [ "$cuda" = 1 ] || echo "no CUDA here: the GPU tests skip, gpu_truth runs --dry-run on two scripts, gpu_overhead --small; the rest is skipped"
  stage tests 100 "${PYTEST_GPU[@]}"
  if [ "$cuda" = 1 ]; then
    stage truth 420 "$PY" benchmarks/gpu_truth.py --timeout 100
    stage mfu 110 "$PY" benchmarks/gpu_mfu.py --variants "${MFU_VARIANTS:-fast}" --steps 60
    stage recipes 150 "$PY" benchmarks/gpu_recipes.py --recipes convnext,seqvae,hf --steps 60
    stage overhead 200 "$PY" benchmarks/gpu_overhead.py --batch 32 --blocks 8 --block 10
  else
    stage truth 400 "$PY" benchmarks/gpu_truth.py --dry-run --only fp32_mlp,memory_limit --budget 20s --results-dir "$OUT"
    stage overhead 300 "$PY" benchmarks/gpu_overhead.py --small --blocks 2 --block 3 --skip 1
  fi

  echo; echo "== results"
  for f in "$OUT"/gpu_*.json; do
    [ -f "$f" ] || continue
    echo "copied $(basename "$f")"
    "$PY" -c "import json,sys; h=json.load(open(sys.argv[1]))['headline']; print('  ', h['label'], '->', h['value'], 'passed' if h['passed'] else 'NOT passed')" "$f" 2>/dev/null
  done
  echo "gpu_check: done, exit $status, $SECONDS s"
  exit "$status"
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
