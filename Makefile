# The two set-up commands of the README:
#   make demo   validate and render the embedded default policy (core packages only)
#   make test   install everything the tests need (Python packages, the CPU build of
#               vLLM 0.32, Debian's Prometheus and Alertmanager) and run the whole suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test lint servers install install-test

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# torch 2.13.0 first: pip then takes the local CPU wheel instead of a CUDA build.
# PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch.
$(VENV)/.test: $(VENV)/.core
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test,vllm]'
	$(PIP) uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
	touch $@

install: $(VENV)/.core
install-test: $(VENV)/.test

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

test: servers $(VENV)/.test
	$(PY) -m pytest $(PYTEST_ARGS)
