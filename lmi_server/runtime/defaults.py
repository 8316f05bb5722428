"""Defaults the server picks where the user set nothing: the built-in models' dtype, eager mode and
tool calling (from their catalogue entry), media limits for image models, whole-prompt prefill on CPU."""

from __future__ import annotations

from typing import Any

from lmi_server import catalogue
from lmi_server.config import host
from lmi_server.config.schema import ServingConfig
from lmi_server.runtime.model_files import max_model_len


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
    entry = catalogue.by_source(cfg.model.source)
    if entry is None or host.gpu_count() > 0:
        return
    pipelined = int(engine_args.get("pipeline_parallel_size") or 1) > 1
    if entry.cpu_eager and pipelined and "enforce_eager" not in engine_args:
        # vLLM 0.32's CPU engine core dies on the first request in eager mode under pipeline
        # parallelism (KeyError in Scheduler.update_from_output; docs/multi-node.md).
        notes.append("built-in model on a CPU host with pipeline parallelism: compiled (eager mode kills vLLM 0.32's "
                     "CPU engine on the first request under pipeline parallelism)")
    elif entry.cpu_eager and "enforce_eager" not in engine_args and "compilation_config" not in engine_args:
        engine_args["enforce_eager"] = True
        notes.append("built-in model on a CPU host: enforce_eager=true (set option.enforce_eager=false to compile)")
    if entry.cpu_dtype is not None and engine_args.get("dtype") in (None, "auto"):
        engine_args["dtype"] = entry.cpu_dtype
        native = host.cpu_has_native_bf16()
        why = {True: "the same answers as on CPUs without native bfloat16", False: "no native bfloat16 on this CPU",
               None: "the same answers on every CPU"}[native]
        notes.append(f"built-in model on a CPU host: dtype={entry.cpu_dtype} ({why}; set option.dtype to choose)")


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
    if budget is not None and int(budget) < max_model_len(model_config, engine_args):
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

    The engine is told what the HTTP layer lets through (media_policy.py: at most DEFAULT_MAX_IMAGES
    images, no videos), so it profiles memory for that instead of vLLM's much higher default.
    Without a usable torchvision a video processor cannot be built at all: videos stay at 0 even
    when the user's limit names only images."""
    if not cfg.kind.vision:
        return
    from lmi_server.media_policy import DEFAULT_MAX_IMAGES
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
    entry = catalogue.by_source(cfg.model.source)
    if entry is None or not entry.tool_calling:
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
