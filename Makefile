# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PIP_PKGS := torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 numpy networkx flatbuffers \
            expecttest pytest hypothesis transformers

.PHONY: demo test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(PIP_PKGS)
	$(VPY) -m pip install -q --no-deps -e . --config-settings editable_mode=compat
	-$(VPY) -m pip install -q libtpu || true  # optional: deviceless TPU compiles (tests skip without it)
	touch $(STAMP)

demo: $(STAMP)
	$(VPY) -m benchmarks.demo

test: $(STAMP)
	$(VPY) -m pytest -q -ra tests

bench: $(STAMP)
	$(VPY) -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
