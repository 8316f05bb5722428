"""vLLM's non-API names, each behind one small function; `USES` lists them for the contract tests.

Callers pass what vLLM handed them (its serving objects, its engine, its scheduler) and get plain
values back; what vLLM calls a name, and where it keeps it, is known here only.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from lmi_server.compat.contract import Use

_RESPONSES = "vllm.entrypoints.openai.responses.serving"
_ANTHROPIC = "vllm.entrypoints.anthropic.serving"
_MODELS = "vllm.entrypoints.openai.models.serving"
_SCHED = "vllm.v1.core.sched.scheduler"
_QUEUE = "vllm.v1.core.sched.request_queue"
_PUNICA = "vllm.lora.punica_wrapper.punica_cpu"
_KV_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_NO_API = "vLLM offers no API for it"

PUNICA_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
"""The CPU LoRA ops that vLLM's `punica_cpu` module imports and calls by module-level name."""

_SGMV = ("inputs", "lora_b_weights", "output_tensor", "b_seq_start_loc", "seq_len_tensor", "lora_indices_tensor",
         "batches", "max_seq_length", "token_nums")
_PUNICA_PARAMS = {
    "bgmv_shrink": ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling"),
    "bgmv_expand": ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "add_inputs"),
    "bgmv_expand_slice": ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "slice_offset",
                          "slice_size", "add_inputs"),
    "sgmv_shrink": ("inputs", "lora_a_weights") + _SGMV[2:] + ("scaling",),
    "sgmv_expand": _SGMV + ("add_inputs",),
    "sgmv_expand_slice": _SGMV + ("slice_offset", "slice_size", "add_inputs"),
}
_PUNICA_WHY = ("the CPU platform names its punica wrapper class (Platform.get_punica_wrapper), which only an "
               "out-of-tree platform plugin replacing the whole CPU platform could change")

USES: tuple[Use, ...] = (
    Use("vllm", "vllm.v1.engine.utils", "get_mp_context", "replace",
        "the engine-core launcher looks this module function up at each launch for its multiprocessing context",
        "compat.vllm.replace_mp_context", "vLLM has no setting for a fork-server start method", params=()),
    Use("vllm", _RESPONSES, "OpenAIServingResponses.response_store", "write",
        "the Responses serving object keeps stored responses in this dict-like attribute (get/[]=)",
        "compat.vllm.bound_responses_store", "the store is an unbounded dict with no size option",
        assigned_in="OpenAIServingResponses.__init__"),
    Use("vllm", _RESPONSES, "OpenAIServingResponses.msg_store", "write",
        "the input messages of stored responses, a dict-like attribute", "compat.vllm.bound_responses_store",
        "as response_store", assigned_in="OpenAIServingResponses.__init__"),
    Use("vllm", _RESPONSES, "OpenAIServingResponses.enable_store", "write",
        "a bool that turns storing on (else only VLLM_ENABLE_RESPONSES_API_STORE does)",
        "compat.vllm.bound_responses_store", "only an environment variable, read at import, turns it on",
        assigned_in="OpenAIServingResponses.__init__"),
    Use("vllm", _RESPONSES, "OpenAIServingResponses._render_resolved_response_inputs", "call",
        "renders a request (with its previous response) to engine input without generating",
        "compat.vllm.responses_prompt_len", "no public render for Responses requests",
        params=("self", "request", "prev_response", "skip_mm_cache")),
    Use("vllm", _RESPONSES, "OpenAIServingResponses._extract_prompt_len", "call",
        "the prompt length of a rendered engine input", "compat.vllm.responses_prompt_len", _NO_API,
        params=("self", "prompt")),
    Use("vllm", "vllm.entrypoints.openai.responses.api_router", "_convert_stream_to_sse_events", "call",
        "encodes Responses stream events as vLLM's own server sends them", "compat.vllm.responses_sse",
        "the SSE encoding is a private helper of vLLM's router", params=("generator",)),
    Use("vllm", "vllm.renderers.chat_utils", "_parse_chat_message_content_mm_part", "call",
        "(kind, value) of a chat content part by vLLM's own rule", "compat.vllm.content_part_kind", _NO_API,
        params=("part",)),
    Use("vllm", _ANTHROPIC, "AnthropicServingMessages._get_disabled_thinking_effort", "call",
        "the reasoning effort that stands for disabled thinking", "compat.vllm.anthropic_chat_request",
        "create_messages does this inside; no public half", params=("self",)),
    Use("vllm", _ANTHROPIC, "AnthropicServingMessages._merge_inline_system", "read",
        "whether inline system messages are merged (set in __init__)", "compat.vllm.anthropic_chat_request",
        "as _get_disabled_thinking_effort", assigned_in="AnthropicServingMessages.__init__"),
    Use("vllm", _ANTHROPIC, "AnthropicServingMessages.to_chat_completion_request", "call",
        "turns a Messages request into a chat completion request", "compat.vllm.anthropic_chat_request",
        _NO_API, params=("anthropic_request", "merge_inline_system", "disabled_thinking_effort")),
    Use("vllm", _ANTHROPIC, "AnthropicServingMessages._convert_image_source_to_url", "call",
        "an Anthropic image source as the URL vLLM fetches", "compat.vllm.anthropic_image_url", _NO_API,
        params=("source",)),
    Use("vllm", _MODELS, "OpenAIServingModels.show_available_models", "replace",
        "GET /v1/models calls this method of the serving object (replaced on the instance)",
        "compat.vllm.extend_model_listing", "no hook adds entries to the model list", params=("self",)),
    Use("vllm", _MODELS, "OpenAIModelRegistry.show_available_models", "call",
        "the base models' listing, without vLLM's own adapter entries", "compat.vllm.extend_model_listing",
        _NO_API, params=("self",)),
    Use("vllm", _MODELS, "OpenAIServingModels.registry", "read", "the model registry of the serving object",
        "compat.vllm.extend_model_listing", _NO_API, assigned_in="OpenAIServingModels.__init__"),
    Use("vllm", _MODELS, "OpenAIServingModels.lora_requests", "write",
        "name -> LoRARequest of loaded adapters; entries are read and deleted",
        "compat.vllm.lora_request / forget_lora", "unloading through vLLM would also drop the engine's weights",
        assigned_in="OpenAIServingModels.__init__"),
    Use("vllm", "vllm.v1.engine.async_llm", "AsyncLLM.generate", "replace",
        "every serving object calls engine.generate(prompt, sampling_params, ...) (wrapped on the instance)",
        "compat.vllm.wrap_engine_generate", "no hook runs around each generation",
        params=("self", "prompt", "sampling_params", "request_id", "prompt_text", "lora_request",
                "tokenization_kwargs", "trace_headers", "priority", "data_parallel_rank", "session_id",
                "kv_hints", "reasoning_ended", "reasoning_parser_kwargs")),
    Use("vllm", _SCHED, "Scheduler.waiting", "write",
        "the waiting queue, read by schedule() from self each step (swapped for one step)",
        "compat.vllm.waiting_swapped", "scheduler_cls lets us subclass, not choose the queue per step",
        assigned_in="Scheduler.__init__"),
    Use("vllm", _SCHED, "Scheduler.kv_holding_waiting", "read",
        "requests holding KV blocks that schedule() admits first", "compat.vllm.kv_holding_waiting", _NO_API,
        assigned_in="Scheduler.__init__"),
    Use("vllm", _SCHED, "Scheduler.policy", "read", "the queue policy a new waiting queue takes",
        "compat.vllm.waiting_swapped", _NO_API, assigned_in="Scheduler.__init__"),
    Use("vllm", _QUEUE, "create_request_queue", "call", "a new empty waiting queue of a policy",
        "compat.vllm.waiting_swapped", _NO_API, params=("policy",)),
    Use("vllm", _QUEUE, "RequestQueue.prepend_requests", "call", "puts requests back in front of the queue",
        "compat.vllm.waiting_swapped", _NO_API, params=("self", "requests")),
    Use("vllm", _QUEUE, "RequestQueue.remove_requests", "call", "takes requests out of the queue",
        "compat.vllm.waiting_swapped", _NO_API, params=("self", "requests")),
    Use("vllm", "vllm.v1.request", "Request.next_decode_eligible_step", "write",
        "schedule() skips a running request while current_step < this", "compat.vllm.defer_decode", _NO_API,
        assigned_in="Request.__init__"),
    *(Use("vllm", _PUNICA, name, "replace", "punica_cpu calls this module-level name for its LoRA products",
          "compat.vllm.replace_punica_cpu_ops", _PUNICA_WHY, params=_PUNICA_PARAMS[name]) for name in PUNICA_OPS),
    Use("vllm", _KV_BASE, "KVConnectorBase_V1._get_connector_metadata", "call",
        "the step's connector metadata, in a connector subclass", "compat.vllm.connector_metadata",
        "protected member of the connector base that subclasses use", params=("self",)),
    Use("vllm", _KV_BASE, "KVConnectorBase_V1._vllm_config", "read", "the engine config a connector was built with",
        "compat.vllm.connector_vllm_config", "protected member of the connector base",
        assigned_in="KVConnectorBase_V1.__init__"),
    Use("vllm", "vllm.distributed.device_communicators.shm_broadcast", "MessageQueue.__init__", "replace",
        "a message ring's chunk size is the max_chunk_bytes argument, 24 MiB when its caller names none "
        "(each worker's response ring)", "compat.vllm.default_message_queue_chunk",
        "only the broadcast ring's chunk is a setting (VLLM_MQ_MAX_CHUNK_BYTES_MB)",
        params=("self", "n_reader", "n_local_reader", "local_reader_ranks", "max_chunk_bytes", "max_chunks",
                "connect_ip", "enable_shm_tensor_arena")),
    Use("vllm", "argparse", "_ActionsContainer._actions", "read",
        "the actions of vLLM's CLI parser (FlexibleArgumentParser, an argparse parser): dest -> type",
        "compat.vllm.cli_actions", "vLLM's parser exposes no action lookup; argparse keeps them private",
        assigned_in="_ActionsContainer.__init__"),
)


_SERVE = "vllm.entrypoints.serve"
_INTERNAL_WHY = "an entry point of vLLM's own server, not of a documented API"


def _internal(module: str, path: str, relies: str, used_by: str, params: tuple[str, ...] | None = None,
              assigned_in: str | None = None) -> Use:
    kind = "read" if assigned_in else "call"
    return Use("vllm", module, path, kind, relies, used_by, _INTERNAL_WHY, params=params, assigned_in=assigned_in,
               private=False)


INTERNAL: tuple[Use, ...] = (
    _internal("vllm.entrypoints.launchers.api_server.app_state", "init_app_state",
              "builds vLLM's serving objects as attributes of a namespace", "lmi_server.engine",
              ("engine_client", "state", "args", "supported_tasks")),
    _internal("vllm.entrypoints.launchers.cli_args", "make_arg_parser", "vLLM's serve CLI, for its defaults",
              "lmi_server.engine", ("parser",)),
    _internal("vllm.entrypoints.launchers.cli_args", "FrontendArgs",
              "the dataclass of vLLM's serve front-end options (the option table is generated from it)",
              "lmi_server.config.vllm_table_gen"),
    *(_internal(module, f"{manager}.{table}", "the registered parser names, a class-level dict",
                "lmi_server.config.vllm_table_gen")
      for module, manager, tables in (
          ("vllm.tool_parsers.abstract_tool_parser", "ToolParserManager", ("tool_parsers", "lazy_parsers")),
          ("vllm.reasoning.abs_reasoning_parsers", "ReasoningParserManager", ("reasoning_parsers", "lazy_parsers")))
      for table in tables),
    _internal("vllm.utils.gc_utils", "freeze_gc_heap", "freezes the start-up heap as vLLM's server does",
              "lmi_server.engine", ()),
    _internal(f"{_SERVE}.utils.api_utils", "with_cancellation", "cancels a handler when the client goes away",
              "lmi_server.api.pipeline", ("handler_func",)),
    _internal(f"{_SERVE}.exception_handling.error_response", "create_error_response",
              "vLLM's ErrorResponse for an exception", "lmi_server.api.errors",
              ("message", "err_type", "status_code", "param")),
    _internal(f"{_SERVE}.middleware.x_request_id", "XRequestIdMiddleware", "echoes X-Request-Id",
              "lmi_server.api.app", ("app",)),
    _internal("vllm.entrypoints.scale_out.render.api_router", "render_chat_completion",
              "vLLM's render route (reads the handler from app.state.serving_render)", "lmi_server.api.openai.render",
              ("request", "raw_request")),
    _internal("vllm.entrypoints.scale_out.render.api_router", "render_completion", "as render_chat_completion",
              "lmi_server.api.openai.render", ("request", "raw_request")),
    _internal("vllm.v1.spec_decode.dynamic.utils", "validate_and_normalize_dynamic_sd_schedule",
              "checks a dynamic speculation schedule as vLLM will", "lmi_server.speculative",
              ("num_speculative_tokens_per_batch_size",)),
    _internal("vllm.config", "get_layers_from_vllm_config", "the attention layers of the engine's model",
              "lmi_server.kvcache.connector", ("vllm_config", "layer_type", "layer_names")),
    _internal(_ANTHROPIC, "AnthropicServingMessages.create_chat_completion", "the chat half of create_messages",
              "lmi_server.api.anthropic.routes", ("self", "request", "raw_request")),
    _internal(_ANTHROPIC, "AnthropicServingMessages.messages_full_converter", "a chat answer as a Messages answer",
              "lmi_server.api.anthropic.routes", ("self", "generator")),
    _internal(_ANTHROPIC, "AnthropicServingMessages.message_stream_converter", "chat chunks as Anthropic events",
              "lmi_server.api.anthropic.routes", ("self", "generator")),
    _internal(_ANTHROPIC, "AnthropicServingMessages.count_tokens", "counts a Messages request's tokens",
              "lmi_server.api.anthropic.routes", ("self", "request", "raw_request")),
    _internal(_RESPONSES, "OpenAIServingResponses.create_responses", "POST /v1/responses",
              "lmi_server.api.responses.routes", ("self", "request", "raw_request")),
    _internal(_RESPONSES, "OpenAIServingResponses.retrieve_responses", "GET /v1/responses/{id}",
              "lmi_server.api.responses.routes", ("self", "response_id", "starting_after", "stream")),
    _internal(_RESPONSES, "OpenAIServingResponses.cancel_responses", "POST /v1/responses/{id}/cancel",
              "lmi_server.api.responses.routes", ("self", "response_id")),
    _internal(_MODELS, "OpenAIServingModels.load_lora_adapter", "loads an adapter and adds it to the engine",
              "lmi_server.adapters.vllm_backend", ("self", "request", "base_model_name")),
    _internal(_MODELS, "OpenAIServingModels.is_base_model", "whether a name is a base model's",
              "lmi_server.adapters.vllm_backend", ("self", "model_name")),
    _internal(_MODELS, "OpenAIServingModels.base_model_paths", "the served base models (name, path)",
              "lmi_server.adapters.vllm_backend, lmi_server.api.pipeline", assigned_in="OpenAIServingModels.__init__"),
    _internal("vllm.v1.engine.async_llm", "AsyncLLM.remove_lora", "drops an adapter's weights by int id",
              "lmi_server.adapters.vllm_backend", ("self", "lora_id")),
    _internal("vllm.v1.engine.async_llm", "AsyncLLM.pin_lora", "keeps an adapter resident",
              "lmi_server.adapters.vllm_backend", ("self", "lora_id")),
)
"""Public-named entry points of vLLM's internal modules that callers use in place (not patched)."""

def replace_mp_context(context: Any) -> bool:
    """Have vLLM start engine cores with `context` from now on; False where its launcher moved."""
    from vllm.v1.engine import utils as launch

    original = getattr(launch, "get_mp_context", None)
    if not callable(original):
        return False
    launch.get_mp_context = _wrapping(lambda: context, original)
    return True


def _wrapping(replacement: Any, original: Any) -> Any:
    """`replacement`, marked as standing for `original` (`__wrapped__`): the contract check reads
    the original's signature through it, whatever ran in this process before."""
    replacement.__wrapped__ = getattr(original, "__wrapped__", original)
    return replacement


def bound_responses_store(serving_responses: Any, make_store: Callable[[], Any]) -> None:
    """Give vLLM's Responses serving object stores made by `make_store` and turn storing on."""
    serving_responses.response_store = make_store()
    serving_responses.msg_store = make_store()
    serving_responses.enable_store = True


def stored_response(serving_responses: Any, response_id: str) -> Any:
    """The stored response `response_id`, or None."""
    return serving_responses.response_store.get(response_id)


async def responses_prompt_len(serving_responses: Any, request: Any, previous: Any) -> int | None:
    """The prompt length vLLM renders for a Responses request (None: vLLM answered an error).
    Exceptions are vLLM's own and propagate."""
    rendered = await serving_responses._render_resolved_response_inputs(request, previous)
    if type(rendered).__name__ == "ErrorResponse":
        return None
    return serving_responses._extract_prompt_len(rendered.engine_input)


async def responses_sse(events: AsyncIterator[Any]) -> AsyncIterator[str]:
    """vLLM's Responses stream events, encoded as its own server sends them."""
    from vllm.entrypoints.openai.responses.api_router import _convert_stream_to_sse_events

    async for text in _convert_stream_to_sse_events(events):
        yield text


def content_part_kind(part: dict[str, Any]) -> str:
    """What vLLM reads a chat content part as (raises on a malformed part)."""
    from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part

    return _parse_chat_message_content_mm_part(part)[0]


async def anthropic_chat_request(serving_messages: Any, request: Any) -> Any:
    """The chat completion request vLLM's create_messages would make of a Messages request."""
    effort = "none"
    if request.thinking is not None and request.thinking.type == "disabled":
        effort = await serving_messages._get_disabled_thinking_effort()
    return serving_messages.to_chat_completion_request(
        request, merge_inline_system=serving_messages._merge_inline_system, disabled_thinking_effort=effort,
    )


def anthropic_image_url(source: dict[str, Any]) -> str:
    """An Anthropic image block's source as the URL vLLM fetches."""
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    return AnthropicServingMessages._convert_image_source_to_url(source)


def extend_model_listing(serving_models: Any, extend: Callable[[Any], Any]) -> None:
    """GET /v1/models answers vLLM's base-model listing passed through `extend` (which adds to
    its `data` and returns it)."""
    base_listing = serving_models.registry.show_available_models

    async def show_available_models() -> Any:
        return extend(await base_listing())

    serving_models.show_available_models = show_available_models


def lora_request(serving_models: Any, name: str) -> Any:
    """The LoRARequest vLLM's serving models hold for adapter `name` (KeyError if none)."""
    return serving_models.lora_requests[name]


def forget_lora(serving_models: Any, name: str, handle: Any) -> None:
    """Drop `name` from vLLM's served adapters if it is still `handle` (the engine keeps the weights)."""
    if serving_models.lora_requests.get(name) is handle:
        del serving_models.lora_requests[name]


def wrap_engine_generate(engine: Any, wrap: Callable[[Any], Any], mark: str) -> bool:
    """Replace the engine object's `generate` by `wrap(generate)`, which carries attribute `mark`;
    False when it is already wrapped (or the engine has no generate)."""
    current = getattr(engine, "generate", None)
    if current is None or getattr(current, mark, None) is not None:
        return False
    engine.generate = wrap(current)
    return True


def kv_holding_waiting(scheduler: Any) -> Any:
    """The scheduler's queue of waiting requests that hold KV blocks (None where vLLM has none)."""
    return getattr(scheduler, "kv_holding_waiting", None)


@contextlib.contextmanager
def waiting_swapped(scheduler: Any, requests: list[Any]) -> Iterator[None]:
    """Within the block the scheduler's waiting queue holds `requests` alone; after it, those left
    unscheduled go back in front of the queue, in their order, before the others."""
    from vllm.v1.core.sched.request_queue import create_request_queue

    queue = scheduler.waiting
    queue.remove_requests(requests)
    scheduler.waiting = create_request_queue(scheduler.policy)
    for request in requests:
        scheduler.waiting.add_request(request)
    try:
        yield
    finally:
        left = list(scheduler.waiting)
        scheduler.waiting = queue
        queue.prepend_requests(reversed(left))  # FCFS prepends in reverse: back in order, in front


def defer_decode(request: Any, step: int) -> None:
    """vLLM's scheduler leaves the running `request` out of every step before `step`."""
    request.next_decode_eligible_step = max(request.next_decode_eligible_step, step)


def replace_punica_cpu_ops(make: Callable[[dict[str, Any]], dict[str, Any]], mark: str) -> bool:
    """Replace vLLM's CPU LoRA ops by `make(originals)` in the module where its CPU punica wrapper
    looks them up; False when done already in this process (the module carries `mark`)."""
    from vllm.lora.punica_wrapper import punica_cpu

    if getattr(punica_cpu, mark, False):
        return False
    originals = {name: getattr(punica_cpu, name) for name in PUNICA_OPS}
    for name, fn in make(originals).items():
        setattr(punica_cpu, name, _wrapping(fn, originals[name]))
    setattr(punica_cpu, mark, True)
    return True


def connector_metadata(connector: Any) -> Any:
    """The connector metadata of the current step, seen from a KV connector subclass."""
    return connector._get_connector_metadata()


def connector_vllm_config(connector: Any) -> Any:
    """The engine config a KV connector was built with."""
    return connector._vllm_config


def cli_actions(parser: Any) -> dict[str, Any]:
    """dest -> action of vLLM's CLI parser."""
    return {action.dest: action for action in parser._actions}


def default_message_queue_chunk(chunk_bytes: int) -> None:
    """vLLM's MessageQueue, made without a max_chunk_bytes, gets `chunk_bytes` (vLLM: 24 MiB); a
    second call replaces the size, never wraps twice."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    original = MessageQueue.__init__
    if getattr(original, "lmi_chunk_bytes", None) is not None:
        original = original.__wrapped__  # type: ignore[attr-defined]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "max_chunk_bytes" not in signature.bind_partial(self, *args, **kwargs).arguments:
            kwargs["max_chunk_bytes"] = chunk_bytes
        original(self, *args, **kwargs)

    __init__.lmi_chunk_bytes = chunk_bytes  # type: ignore[attr-defined]
    MessageQueue.__init__ = __init__  # type: ignore[method-assign]
