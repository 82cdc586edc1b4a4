# The two set-up commands of the README:
#   make demo   validate and render the embedded default policy (core packages only)
#   make test   install everything the tests need (Python packages, the CPU build of
#               vLLM 0.32, Debian's Prometheus and Alertmanager, checkov in a venv of its
#               own) and run the whole suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION := 3.3.30

.PHONY: demo test test-fast lint servers install install-test checkov

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# torch 2.13.0 first: pip then takes the local CPU wheel instead of a CUDA build.
# PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch.
$(VENV)/.test: $(VENV)/.core
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test,vllm,ray]'
	$(PIP) uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
	touch $@

# checkov pins an older `packaging` than Pulumi needs: it gets a virtualenv of its own, which
# tests/infra/test_checkov.py runs on the rendered bundle.
$(CHECKOV_VENV)/.installed:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip --disable-pip-version-check -q install checkov==$(CHECKOV_VERSION)
	touch $@

install: $(VENV)/.core
install-test: $(VENV)/.test
checkov: $(CHECKOV_VENV)/.installed

servers:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null \
	  && command -v promtool >/dev/null && command -v amtool >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager; }

demo: $(VENV)/.core
	$(VENV)/bin/gpupool demo

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy policy infra alerts runtime
	# the benchmark scripts too: they call the product's APIs, and a changed signature must fail here
	$(VENV)/bin/mypy --explicit-package-bases --follow-imports=silent bench/*.py

test: servers $(VENV)/.test $(CHECKOV_VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# The developer's loop: the quick pure tests (no server, engine, vLLM import or other program;
# tests/harness/purity.py fails a test that needs one and is not marked; `heavy` ones left out).
test-fast: $(VENV)/.test
	GPUPOOL_PURE_TESTS=1 $(PY) -m pytest -m "not slow and not vllm and not process and not heavy" $(PYTEST_ARGS)
