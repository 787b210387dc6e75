# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first;
# `make demo` installs only what the demo uses, `make test` everything (DeepSpeed included).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EXTRAS ?= dev,tensorboard,report,lightning,hf,vision,wandb,patch,deepspeed
# The demo: its script decodes PNGs (vision), the report's plots (report), best.patch (patch); the
# naive recipes the README shows next log to TensorBoard, as people first write it (tensorboard).
DEMO_EXTRAS ?= report,vision,patch,tensorboard
# DeepSpeed JIT-builds a CPU op on first use (minutes on 2 cores); built once here, reused by the tests.
TORCH_EXTENSIONS ?= $(CURDIR)/.cache/torch_extensions
DEMO_STEPS ?= 40
# `make test` spreads the tests over TEST_WORKERS pytest-xdist workers (the suite's steps are
# single-threaded and many tests wait for subprocesses); the tests that plant their own CPU load
# (`alone`) run after them, with the machine to themselves.
TEST_WORKERS ?= 2

.PHONY: venv demo test test-all gpu-test bench browser clean

venv: $(VENV)/.installed

# torch==2.13.0 is a CPU build on these machines' disk; a user's own torch (>=2.4) is kept.
# numpy with it: torch imported before numpy is there prints "Failed to initialize NumPy".
$(VENV)/.base: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "numpy>=1.24"
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	touch $@

# What the demo needs, and no more (no DeepSpeed build, no test tools); a full venv has it all.
$(VENV)/.demo: $(VENV)/.base
	test -f $(VENV)/.installed || $(PIP) install -q -e ".[$(DEMO_EXTRAS)]"
	touch $@

$(VENV)/.installed: $(VENV)/.base
	@# DeepSpeed ships an sdist that imports torch at build time: no build isolation, torch kept as it is.
	@# If it does not install, the rest still does and the DeepSpeed tests skip.
	$(PIP) install -q setuptools wheel
	$(PIP) show -q deepspeed 2>/dev/null || $(PIP) install -q --no-build-isolation "deepspeed>=0.14" \
	  "torch==$$($(PY) -c 'import torch; print(torch.__version__.split("+")[0])')" \
	  || echo "note: deepspeed did not install; the DeepSpeed tests will be skipped"
	extras="$(EXTRAS)"; $(PIP) show -q deepspeed 2>/dev/null || extras=$$(echo "$$extras" | sed 's/,*deepspeed//'); \
	  $(PIP) install -q -e ".[$$extras]"
	@# The venv's ninja first, as the tests run it (another ninja version would rebuild the op).
	$(PIP) show -q deepspeed 2>/dev/null && { PATH="$(CURDIR)/$(VENV)/bin:$$PATH" DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$(TORCH_EXTENSIONS) \
	  $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null \
	  || echo "note: DeepSpeed's CPU op did not build; the DeepSpeed tests will be skipped"; } || true
	touch $@

# Headless Chromium for the HTML report's browser test (Debian package; skipped when apt is absent).
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "note: chromium not installed; the browser test will be skipped"; }

demo: $(VENV)/.demo
	$(PY) -m trainspeed.demo --steps $(DEMO_STEPS)
	@echo "trainspeed is installed in $(VENV): source $(VENV)/bin/activate, then trainspeed doctor -- python train.py"

# The suite starts ~250 Python processes: with PYTHONDONTWRITEBYTECODE set (as on these
# machines), each one compiled trainspeed's modules again and each pytest worker re-rewrote the
# test files (3.7 s of CPU per collection). Bytecode is written under __pycache__ (ignored by git).
TEST_ENV := PYTHONDONTWRITEBYTECODE=

# `make test` leaves out the tests marked `slow`: the end-to-end runs of several processes
# (torchrun and DeepSpeed ranks, whole tunes, the demo) held 518 of the suite's 916 test-seconds
# on 2 cores, each process importing torch (2.3 s of CPU here) for a few steps. Every capability
# keeps a test in it. `make test-all` runs every test; CI (CI=true, as .ci/run sets) always does.
TEST_SCOPE ?= $(if $(filter true 1 yes,$(CI)),,and not slow)

test: venv browser
	$(TEST_ENV) $(PY) -m pytest -q -m "not gpu and not alone $(TEST_SCOPE)" -n $(TEST_WORKERS) --dist loadgroup --durations=15
	@# Only the files that mark tests `alone` are collected: collecting the whole suite to run 7
	@# tests imported Lightning, Accelerate and the rest (~11 s of CPU) for nothing.
	$(TEST_ENV) $(PY) -m pytest -q -m "alone and not gpu $(TEST_SCOPE)" --durations=5 $$(grep -rlE "mark\.alone\b" tests --include='test_*.py')
	@$(if $(TEST_SCOPE),echo "make test left out the slow end-to-end tests: make test-all runs them too (CI does)")

test-all:
	$(MAKE) test TEST_SCOPE=

# The GPU tests on a lent GPU: no venv or package index needed (PYTHONPATH=src, python3 with
# CUDA torch); the file list lives in benchmarks/gpu_check.sh, which also runs the GPU benchmarks.
gpu-test:
	PYTHON=$${PYTHON:-python3} bash benchmarks/gpu_check.sh --tests-only

bench: venv
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
