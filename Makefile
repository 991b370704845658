# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PIP_PKGS := torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 numpy networkx flatbuffers \
            expecttest pytest pytest-xdist hypothesis transformers==5.24.0 matplotlib \
            diffusers accelerate

.PHONY: demo test bench coverage browser clean

$(STAMP): pyproject.toml Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(PIP_PKGS)
	$(VPY) -m pip install -q --no-deps -e . --config-settings editable_mode=compat
	-$(VPY) -m pip install -q libtpu || true  # optional: deviceless TPU compiles (tests skip without it)
	-$(VPY) -m torchtpu.kernels.aten_cpu  # ATen's CPU convolution for XLA programs (else XLA's own)
	-$(VPY) -m torchtpu.device.native  # the tpu device's C++ library (fused attention, the guard, the views, each op's path and defer mode's record; else Python's)
	touch $(STAMP)

demo: $(STAMP)
	$(VPY) -m benchmarks.demo

# Two pytest workers, one test file each at a time (a file's tests share module state, e.g. the
# OpInfo pass rates); the slowest tests are listed at the end.
PYTEST_WORKERS ?= 2
test: $(STAMP) browser
	$(VPY) -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile --durations=25 tests

# Headless Chromium for the inspector's HTML test (Debian's package; the test skips, naming
# the reason, where it cannot be installed).
browser:
	-@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null 2>&1 \
	  || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1) \
	  || echo "chromium could not be installed: the HTML-report browser test will skip"

# The model-coverage suite (also part of make test) as a table: docs/coverage.md; then the OpInfo
# sweep with every case's full samples (make test tries fewer of the cases expected to pass).
coverage: $(STAMP)
	TORCHTPU_COVERAGE_FULL=1 $(VPY) tests/model_coverage.py --write docs/coverage.md
	TORCHTPU_OPINFO_FULL=1 $(VPY) -m pytest -q -n $(PYTEST_WORKERS) tests/test_opinfo.py

bench: $(STAMP)
	$(VPY) -m benchmarks.suite

clean:
	rm -rf $(VENV) build *.egg-info
