"""The one request pipeline of every generating route; front doors only parse and choose a shape.

A front door (`api/openai/`, `api/sagemaker/`, and any new one) is one module that:

1. fixes the request's `Shape` (OpenAI, LMI, TGI, Anthropic): errors and answers take it;
2. says how to turn the request body into what vLLM is called with, a `parse(body) -> Generation`
   (sync or async): the parsed vLLM request object (`ChatCompletionRequest`, `CompletionRequest`,
   `ResponsesRequest`, ...), the vLLM serving method to call (`method(serving)` picks it from the
   engine's serving objects, e.g. `lambda s: s.openai_serving_chat.create_chat_completion`), and
   how to shape vLLM's answer (`shape_json` for a JSON body, `shape_stream` for its SSE events,
   `stream` the wire format: "sse" or "jsonl");
3. calls `await serve(request, parse, shape=..., headers=..., body=...)` and returns its response.
   `headers`: extra response headers (e.g. a session's); `body`: the body when the front door had
   to read it already (/invocations reads it for sessions and a custom handler), else it is read here.

`serve` then runs each stage once, in this order:

- read: the body (size limit 413, JSON syntax and depth 400), unless handed in;
- check: the engine is ready (503 with Retry-After);
- resolve adapter and tenant: the adapter the request names (header, body `adapters`, `model`)
  leased, loading it on first use (404 naming what is served when there is none such; LoRA on or
  off, never the base model's answer instead); with it everything the tenant is known by (the API
  key, else this adapter, else the operator's header: named as admission starts);
- format in: the payload formatter of that adapter (else of the model directory) rewrites the body;
  the output formatter that applies is recorded; then the front door's `parse` (its 400/422/424s)
  and the parsed request's checks: content parts the model cannot read, foreign message formats,
  images against the media policy, the adapter's name (or LMI's `"model": "lmi"` alias for the
  base model) in `model`, combinations the engine cannot serve (400), the KV cache salt isolated
  per adapter (LoRA on);
- admit: an engine slot in the admission policy's order (`lmi_server.admission`), or 429/503;
  the tenant it admitted is named in the vLLM request for the engine's scheduler
  (`lmi_server.tenant_scheduler`);
- call vLLM: the serving method, cancelled if the client disconnects (vLLM's `with_cancellation`);
  vLLM's errors become typed errors;
- format out and respond: the output formatter, the front door's shape, SSE or jsonlines for a
  stream (closing the stream closes vLLM's generator, which aborts the generation).

The adapter lease and the admission ticket are released when the response is over, however it
ends (`api/request_scope.RequestScopeMiddleware`); every error is rendered once, in the request's shape
(`api/errors.py`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from lmi_server.adapters.transforms import isolated_cache_salt
from lmi_server.api.adapters.routing import LMI_MODEL_NAME, resolve_adapter
from lmi_server.api.admit import admit
from lmi_server.api.body import read_json_body
from lmi_server.api.context import Shape, app_context, begin, request_context
from lmi_server.api.errors import APIError, engine_unavailable, from_engine_limit, from_vllm_error, from_vllm_exception
from lmi_server.api.format_in import apply_payload_formatter
from lmi_server.api.respond import DoorFormatting, respond, sse_to_jsonl, yielding
from lmi_server.api.media import check_messages
from lmi_server.compat import vllm as compat_vllm
from lmi_server.engine_limits import UnsupportedCombination
from lmi_server.tenant_scheduler import TENANT_ARG
from lmi_server.usage_metrics import Usage

UNREAD = object()
TEXT_PART_TYPES = {"text", "input_text", "output_text", "refusal", "thinking"}


def _same(value: Any) -> Any:
    return value


@dataclass
class Generation:
    """What a front door's `parse` hands to `serve` (see the module docstring)."""

    request: Any
    """The parsed vLLM request object (its `model`, `priority`, `cache_salt` are set by serve)."""
    method: Callable[[Any], Callable[..., Any]]
    """serving objects -> the vLLM serving method, called as `method(serving)(request, raw_request)`."""
    shape_json: Callable[[dict], Any] = _same
    """vLLM's JSON answer (a dict) -> the body sent."""
    shape_stream: Callable[[AsyncIterator[str]], AsyncIterator[Any]] | None = None
    """vLLM's SSE events -> the stream sent; None: SSE as is, or jsonlines when `stream="jsonl"`."""
    stream: str = "sse"
    """Wire format of a streamed answer: "sse" or "jsonl"."""
    dump: Callable[[Any], Any] | None = None
    """vLLM's answer object -> JSON values before `shape_json`; None: `model_dump(exclude_none=False)`."""
    formatting: DoorFormatting | None = None
    """How an output formatter sees this door's answers (`api/respond.DoorFormatting`); None: vLLM's
    chat or completion objects and chunks, as they are."""


def engine_state(request: Request):
    """The running engine's state; 503 with Retry-After while it loads or is rebuilt."""
    state = app_context(request).owner.state
    if not state.healthy:
        raise engine_unavailable(state.error or "the model is still loading")
    return state


def served_name(state) -> str | None:
    """The base model's first served name (what LMI calls the model: "lmi" stands for it)."""
    models = getattr(getattr(state, "serving", None), "openai_serving_models", None)
    paths = getattr(models, "base_model_paths", None) or []
    return paths[0].name if paths else None


async def until_disconnect(coro: Awaitable[Any], request: Request) -> Any:
    """Run coro under vLLM's `with_cancellation`: if the client goes away first, coro is cancelled
    (vLLM aborts the request on cancel) and the request ends with a 400."""
    from vllm.entrypoints.serve.utils.api_utils import with_cancellation

    async def work(_self: Any, raw_request: Request) -> tuple[Any]:
        return (await coro,)  # a tuple: with_cancellation's None means "disconnected"

    done = await with_cancellation(work)(None, request)
    if done is None:
        raise APIError(400, "client disconnected before the response was ready")
    return done[0]


def is_error(result: Any) -> bool:
    return type(result).__name__ == "ErrorResponse"


async def call_serving(coro: Awaitable[Any], request: Request) -> Any:
    """Await a vLLM serving call; ErrorResponse -> APIError; generators are returned as they are."""
    try:
        result = await until_disconnect(coro, request)
    except APIError:
        raise
    except Exception as exc:
        mapped = from_vllm_exception(exc)
        if mapped is None:
            raise
        raise mapped from None
    if is_error(result):
        raise from_vllm_error(result)
    return result


def content_part_kind(part: Any) -> str | None:
    """What vLLM will read a content part as: its `type`, or, with no type (or with a `uuid`), the
    first media field it carries (`video_url`, `image_embeds`, ...), by vLLM's own rule."""
    if not isinstance(part, dict):
        return None
    try:
        return compat_vllm.content_part_kind(part)
    except Exception:  # a malformed part: vLLM's own 400 says what is wrong with it
        return part.get("type")


def reject_foreign_messages(parsed: Any, state: Any) -> None:
    """Image/audio/video parts for a text-only model are a 400 (vLLM raises a ValueError that would be
    a 500). vLLM's chat request type also validates OpenAI-Harmony `Message` objects (author, channel,
    recipient), which only gpt-oss models render; any other model would fail inside vLLM with a 500."""
    messages = getattr(parsed, "messages", None) or []
    model_config = getattr(state.engine, "model_config", None)
    if not getattr(model_config, "is_multimodal_model", False):
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            for part in content if isinstance(content, list) else []:
                kind = content_part_kind(part)
                if kind is not None and kind not in TEXT_PART_TYPES:
                    raise APIError(400, f"messages[{i}]: content of type {kind!r} needs a multimodal model; this model reads text")
    # Harmony's Message has an author; other typed messages (Anthropic's) are their front door's to check
    foreign = [i for i, m in enumerate(messages) if not isinstance(m, dict) and hasattr(m, "author")]
    if not foreign:
        return
    hf_config = getattr(model_config, "hf_config", None)
    if getattr(hf_config, "model_type", None) == "gpt_oss":
        return
    raise APIError(
        400,
        f"messages[{foreign[0]}]: a Harmony-format message (author/channel/recipient) is only accepted by "
        "gpt-oss models; send {\"role\": ..., \"content\": ...}",
    )


def lmi_model_alias(parsed: Any, state: Any) -> None:
    """`"model": "lmi"` names the base model, as in LMI (unless a model is really served as "lmi")."""
    if getattr(parsed, "model", None) == LMI_MODEL_NAME:
        name = served_name(state)
        if name != LMI_MODEL_NAME:
            parsed.model = name


async def check_request(request: Request, parsed: Any, state: Any, *, generates: bool = True) -> None:
    """The parsed request's checks before it takes a slot (see `serve`); `generates=False`
    (rendering only tokenizes): the engine's generation limits do not apply."""
    reject_foreign_messages(parsed, state)
    if getattr(getattr(state.engine, "model_config", None), "is_multimodal_model", False):
        policy = app_context(request).media_policy
        await asyncio.to_thread(check_messages, getattr(parsed, "messages", None) or [], policy)
    lmi_model_alias(parsed, state)
    use = request_context(request).adapter
    if use is not None:
        parsed.model = use.name  # vLLM picks the LoRARequest by this name
    limits = app_context(request).engine_limits
    if generates and limits is not None:
        try:
            limits.check(parsed)
        except UnsupportedCombination as exc:
            raise from_engine_limit(exc) from None


def apply_cache_salt(request: Request, engine_request: Any) -> None:
    """With LoRA on, the salt of the vLLM request about to be sent: KV reuse isolated per adapter
    and weights (see `isolated_cache_salt`). With it off, the client's own `cache_salt`, if any,
    is used as sent."""
    if not app_context(request).lora:
        return
    use = request_context(request).adapter
    identity = use.lease.entry.cache_identity() if use is not None and use.lease is not None else None
    engine_request.cache_salt = isolated_cache_salt(identity, getattr(engine_request, "cache_salt", None))


def tag_tenant(engine_request: Any, tenant: str | None) -> None:
    """Name the tenant admission chose in the vLLM request (`vllm_xargs`, which vLLM carries into
    the engine as SamplingParams.extra_args), for the engine's scheduler
    (`lmi_server.tenant_scheduler`). Whatever the client put under that key is overwritten."""
    if tenant is None or not hasattr(engine_request, "vllm_xargs"):
        return
    engine_request.vllm_xargs = {**(engine_request.vllm_xargs or {}), TENANT_ARG: tenant}


async def read_checked(request: Request, body: Any = UNREAD, *, generates: bool = True) -> tuple[Any, Any]:
    """read -> check (engine ready) -> resolve the adapter -> format in: (formatted body, engine
    state). `generates=False` (the render routes only tokenize): no adapter is leased."""
    if body is UNREAD:
        body = await read_json_body(request, app_context(request).config.server.max_request_bytes)
    state = engine_state(request)  # 503 first: nothing runs before the engine is ready
    if generates:
        await resolve_adapter(request, body)
    return apply_payload_formatter(request, body), state


async def serve(
    request: Request,
    parse: Callable[[Any], Any],
    *,
    shape: Shape,
    headers: dict[str, str] | None = None,
    body: Any = UNREAD,
) -> Response:
    """read -> check -> resolve adapter and tenant -> format in -> admit -> call vLLM -> format
    out -> respond (see the module docstring)."""
    begin(request, shape)
    body, state = await read_checked(request, body)
    gen = parse(body)
    if inspect.isawaitable(gen):
        gen = await gen
    await check_request(request, gen.request, state)
    apply_cache_salt(request, gen.request)
    await until_disconnect(admit(request, state, gen.request), request)
    tag_tenant(gen.request, request_context(request).tenant)
    result = await call_serving(gen.method(state.serving)(gen.request, request), request)
    shape_stream = gen.shape_stream or (_same if gen.stream == "sse" else sse_to_jsonl)
    ctx = request_context(request)
    ticket = ctx.ticket  # hears of the stream's first chunk
    usage = Usage(ctx.tenant, ctx.adapter, ctx.arrived)  # tokens and TTFT by tenant and adapter
    return await respond(
        request, result, shape_json=lambda body: gen.shape_json(usage.json(body)), shape_stream=shape_stream,
        kind=gen.stream, headers=headers, wrap=lambda stream: yielding(usage.stream(stream), ticket),
        formatting=gen.formatting, **({"dump": gen.dump} if gen.dump is not None else {}),
    )
