#!/usr/bin/env bash
# Every GPU check of issue 29 in one run, for a lent GPU session (about 10 minutes on an H100;
# 7:20 on 2026-11-27, before the recipes stage and the second MFU run):
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh            # the device: $OUT is set for you
#   bash benchmarks/gpu_check.sh --tests-only             # `make gpu-test`: the pytest part only
#
# 1. the GPU tests (pytest -m gpu over the files below, 100 s); 2. benchmarks/gpu_mfu.py (gpt at
# GPT-2 124M, bf16 + compile + fused AdamW, cuDNN attention first on Hopper and torch's order
# beside it, 150 s); 3. benchmarks/gpu_truth.py (the doctor names each planted GPU cause first,
# then the tune verifies its fix; 380 s: the doctor runs all come first, the fixes as far as
# time allows, rerun the rest with --only NAME); 4. benchmarks/gpu_recipes.py (the other
# recipes' fast variants: their MFU, 150 s). Each runs under its own `timeout`; one that fails
# or times out does not stop the others, and the results files are copied to $OUT after each
# stage, so a run cut short still brings back what it measured. No virtual environment and no
# package index are needed: PYTHONPATH=src and the machine's python3 (torch with CUDA). Output
# goes to $OUT/gpu_check.log, the results files to $OUT (at most 8 files in all). A stage past
# its timeout gets SIGINT (Python stops its child runs), SIGKILL 10 s later. Without CUDA it
# says so, runs the tests (which skip) and gpu_truth.py --dry-run on two scripts (the wiring),
# and skips the rest.
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
  tests/engine/data/test_data_prefetch.py tests/engine/checkpoint/test_ckpt_async.py"

run_tests() {
  # -v: each result on its own line as it comes, so a run cut by the timeout still shows them
  # shellcheck disable=SC2086 # the list is word-split on purpose
  timeout -s INT -k 10 "${1:-120}" "$PY" -m pytest -v -m gpu -p no:cacheprovider -o addopts="-ra" --durations=5 $GPU_TESTS
}

if [ "${1:-}" = "--tests-only" ]; then
  run_tests 300
  exit $?
fi

STAMP=$(mktemp)  # results files written after this are this run's
copy_results() {
  # this run's results files so far into $OUT (at most 6: the log and room to spare make 8)
  local n=0 f
  for f in benchmarks/results/gpu_truth-*.json benchmarks/results/gpu_mfu-*.json benchmarks/results/gpu_recipes-*.json; do
    [ -f "$f" ] && [ "$f" -nt "$STAMP" ] && [ "$n" -lt 6 ] || continue
    cp "$f" "$OUT/" && n=$((n + 1))
  done
}

cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
status=0
{
  echo "== gpu_check $(date -u +%FT%TZ) on $(hostname): python $("$PY" -V 2>&1 | cut -d' ' -f2), torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import pynvml" 2>/dev/null && echo "pynvml: yes (GPU busy from NVML)" || echo "pynvml: no (no GPU busy figure)"
  "$PY" -c "import libcst" 2>/dev/null && echo "libcst: yes" || echo "libcst: no (the tune's code change is skipped)"
  [ "$cuda" = 1 ] || echo "no CUDA here: the GPU tests skip, gpu_truth runs --dry-run on two scripts, gpu_mfu is skipped"

  echo; echo "== 1/4 GPU tests (timeout 100 s)"; t0=$SECONDS
  run_tests 100 || { echo "GPU tests: exit $?"; status=1; }
  echo "GPU tests: $((SECONDS - t0)) s"

  echo; echo "== 2/4 gpu_mfu.py (timeout 150 s)"; t0=$SECONDS
  if [ "$cuda" = 1 ]; then
    timeout -s INT -k 10 150 "$PY" benchmarks/gpu_mfu.py --variants fast,fast-torch-sdpa --steps 60 || { echo "gpu_mfu: exit $?"; status=1; }
  else
    echo "gpu_mfu: skipped (no CUDA)"
  fi
  echo "gpu_mfu: $((SECONDS - t0)) s"; copy_results

  echo; echo "== 3/4 gpu_truth.py (timeout 380 s)"; t0=$SECONDS
  if [ "$cuda" = 1 ]; then
    timeout -s INT -k 10 380 "$PY" benchmarks/gpu_truth.py --timeout 100 || { echo "gpu_truth: exit $?"; status=1; }
  else
    timeout -s INT -k 10 400 "$PY" benchmarks/gpu_truth.py --dry-run --only fp32_mlp,memory_limit --budget 20s \
      --results-dir "$OUT" || { echo "gpu_truth --dry-run: exit $?"; status=1; }
  fi
  echo "gpu_truth: $((SECONDS - t0)) s"; copy_results

  echo; echo "== 4/4 gpu_recipes.py (timeout 150 s)"; t0=$SECONDS
  if [ "$cuda" = 1 ]; then
    timeout -s INT -k 10 150 "$PY" benchmarks/gpu_recipes.py --recipes convnext,seqvae,hf --steps 60 || { echo "gpu_recipes: exit $?"; status=1; }
  else
    echo "gpu_recipes: skipped (no CUDA)"
  fi
  echo "gpu_recipes: $((SECONDS - t0)) s"; copy_results

  echo; echo "== results"
  copy_results
  for f in "$OUT"/gpu_truth-*.json "$OUT"/gpu_mfu-*.json "$OUT"/gpu_recipes-*.json; do
    [ -f "$f" ] || continue
    echo "copied $(basename "$f")"
    "$PY" -c "import json,sys; h=json.load(open(sys.argv[1]))['headline']; print('  ', h['label'], '->', h['value'], 'passed' if h['passed'] else 'NOT passed')" "$f" 2>/dev/null
  done
  echo "gpu_check: done, exit $status, $SECONDS s"
  exit "$status"
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
