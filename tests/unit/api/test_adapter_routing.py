"""The adapter path in the API and the one way out: KV salt per adapter; output formatters on
vLLM's response objects and raw stream chunks (edited -> still shaped, anything else -> sent as is),
424 before a stream starts, an error event mid-stream, generators closed (engine request aborted)
and the lease released."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from lmi_server.adapters.formatters import Formatters
from lmi_server.adapters.transforms import isolated_cache_salt
from pydantic import BaseModel

from lmi_server.api.adapters.routing import AdapterUse
from lmi_server.api.pipeline import apply_cache_salt
from lmi_server.api.request_scope import RequestScopeMiddleware
from lmi_server.api.context import REQUEST_KEY, RequestContext, Shape, request_context
from lmi_server.api.errors import APIError
from lmi_server.api.respond import respond


def test_cache_salt_follows_the_requests_adapter():
    entry = SimpleNamespace(cache_identity=lambda: "lora:a:fp1")
    app = SimpleNamespace(state=SimpleNamespace(ctx=SimpleNamespace(lora=True)))
    use = SimpleNamespace(lease=SimpleNamespace(entry=entry))
    req = SimpleNamespace(app=app, scope={"state": {REQUEST_KEY: RequestContext(adapter=use)}})
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(req, parsed)
    assert parsed.cache_salt == isolated_cache_salt("lora:a:fp1", None)
    base = SimpleNamespace(app=app, scope={"state": {}})
    parsed = SimpleNamespace(cache_salt=None)
    apply_cache_salt(base, parsed)
    assert parsed.cache_salt is None
    lora_off = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(ctx=SimpleNamespace(lora=False))), scope=req.scope)
    parsed = SimpleNamespace(cache_salt="client's")
    apply_cache_salt(lora_off, parsed)
    assert parsed.cache_salt == "client's"  # LoRA off: the client's own salt, as sent


class Completion(BaseModel):
    choices: list[dict]


def _request(fmt, lmi=False):
    formatters = Formatters(response_output=fmt, owner="adapter 'a'")
    ctx = RequestContext(shape=Shape.LMI if lmi else Shape.OPENAI, formatters=formatters)
    return SimpleNamespace(scope={"state": {REQUEST_KEY: ctx}})


def _respond(request, result, **kw):
    kw.setdefault("shape_json", lambda body: {"shaped": body})
    kw.setdefault("shape_stream", lambda events: events)
    return asyncio.run(respond(request, result, kind=kw.pop("kind", "sse"), headers=None, **kw))


def test_a_formatter_that_edits_the_response_keeps_the_schemas_shape_and_others_are_sent_as_is():
    def shout(response):
        for choice in response.choices:
            choice["text"] = choice["text"].upper()
        return response

    edited = _respond(_request(shout), Completion(choices=[{"text": "ab"}]))
    assert json.loads(edited.body) == {"shaped": {"choices": [{"text": "AB"}]}}
    replaced = _respond(_request(lambda r: {"answer": r.choices[0]["text"]}), Completion(choices=[{"text": "ab"}]))
    assert json.loads(replaced.body) == {"answer": "ab"}  # LMI: what the formatter returns is sent
    plain = _respond(SimpleNamespace(scope={"state": {}}), Completion(choices=[{"text": "ab"}]))
    assert json.loads(plain.body) == {"shaped": {"choices": [{"text": "ab"}]}}

    def boom(response):
        raise ValueError("nope")

    with pytest.raises(APIError) as err:
        _respond(_request(boom, lmi=True), Completion(choices=[{"text": "ab"}]))
    assert err.value.status == 424 and err.value.body(Shape.LMI) == {"error": err.value.message, "code": 424}


def _run_stream(fmt, chunks, kind="sse", shape_stream=None):
    """respond() over a stream of `chunks`; returns (messages, produced, closed)."""
    produced, closed, messages = [], [], []

    async def gen():
        try:
            for c in chunks:
                produced.append(c)
                yield c
        finally:
            closed.append(True)

    async def receive():
        await asyncio.Event().wait()

    async def send(message):
        messages.append((len(produced), message))

    async def main():
        request = _request(fmt)
        g = gen()
        response = await respond(request, g, shape_json=dict, shape_stream=shape_stream or (lambda events: events),
                                 kind=kind, headers=None)
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "path": "/v1/completions", "headers": []}
        await response(scope, receive, send)

    asyncio.run(main())
    return messages, produced, closed


def _body(messages) -> str:
    return b"".join(m.get("body", b"") for _, m in messages if m["type"] == "http.response.body").decode()


def _text(chunk: str) -> str:
    return json.loads(chunk[len("data: "):])["choices"][0]["text"]


def test_the_formatter_gets_each_raw_chunk_string_as_lmi_hands_it():
    seen = []

    def fmt(chunk):
        seen.append(chunk)
        return {"piece": _text(chunk)} if chunk != "data: [DONE]\n\n" else {"done": True}

    chunks = [f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n' for i in range(3)] + ["data: [DONE]\n\n"]
    messages, _, _ = _run_stream(fmt, chunks, kind="jsonl")
    assert seen == chunks  # strings, [DONE] included (on /invocations)
    assert [json.loads(line) for line in _body(messages).splitlines()] == [{"piece": "t0"}, {"piece": "t1"}, {"piece": "t2"}, {"done": True}]


def test_edited_chunks_are_still_shaped_for_the_schema():
    def shout(chunk):
        data = json.loads(chunk[len("data: "):])
        data["choices"][0]["text"] = data["choices"][0]["text"].upper()
        return "data: " + json.dumps(data) + "\n\n"

    async def count_lines(events):
        async for event in events:
            yield "line:" + _text(event) + "\n"

    chunks = [f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n' for i in range(3)]
    messages, _, _ = _run_stream(shout, chunks, kind="jsonl", shape_stream=count_lines)
    assert _body(messages).splitlines() == ["line:T0", "line:T1", "line:T2"]


def test_formatter_raising_mid_stream_ends_with_an_error_event_and_closes_the_generator():
    calls = []

    def fmt(chunk):
        calls.append(chunk)
        if len(calls) > 3:
            raise ValueError("boom")
        return {"piece": _text(chunk).upper()}

    chunks = [f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n' for i in range(1000)]
    messages, produced, closed = _run_stream(fmt, chunks)
    bodies = _body(messages)
    assert messages[0][1]["status"] == 200 and '"T0"' in bodies
    last = bodies.strip().splitlines()[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == 424 and "boom" in last
    assert closed and len(produced) < 10  # generation stopped, not drained to the end


def test_jsonlines_stream_error_is_a_jsonlines_line():
    def fmt(chunk):
        if _text(chunk) == "t2":
            raise ValueError("boom")
        return {"piece": _text(chunk)}

    chunks = [f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n' for i in range(100)]
    messages, produced, closed = _run_stream(fmt, chunks, kind="jsonl")
    lines = _body(messages).splitlines()
    assert json.loads(lines[-1])["code"] == 424 and "boom" in lines[-1]
    assert closed and len(produced) < 10


def test_formatter_failing_on_the_first_chunk_is_a_424_before_the_response_starts():
    def fmt(chunk):
        raise ValueError("refused")

    with pytest.raises(APIError) as err:
        _run_stream(fmt, ['data: {"choices": [{"text": "a"}]}\n\n'] * 100)
    assert err.value.status == 424 and "refused" in err.value.message


def test_the_lease_is_released_when_the_response_fails():
    released = []
    lease = SimpleNamespace(release=lambda: asyncio.sleep(0, released.append(True)))

    async def app(scope, receive, send):
        request_context(scope).adapter = AdapterUse("a", lease)
        raise RuntimeError("the route failed")

    scope = {"type": "http", "state": {}}
    with pytest.raises(RuntimeError):
        asyncio.run(RequestScopeMiddleware(app)(scope, None, None))
    assert released == [True]


# ---------------------------------------------------------------- naming an adapter: served by it or a 404


def _naming_request(headers=None, registry=None):
    from lmi_server.api.adapters.routing import ADAPTER_HEADER

    models = SimpleNamespace(base_model_paths=[SimpleNamespace(name="base-model")], is_base_model=lambda m: m == "base-model")
    app = SimpleNamespace(state=SimpleNamespace(ctx=SimpleNamespace(
        adapters=SimpleNamespace(registry=lambda: registry),
        owner=SimpleNamespace(state=SimpleNamespace(serving=SimpleNamespace(openai_serving_models=models))),
    )))
    return SimpleNamespace(app=app, headers={ADAPTER_HEADER: headers} if headers else {}, scope={"state": {}})


def _fields(**fields):
    return {k: v for k, v in fields.items() if v is not None}


@pytest.mark.parametrize(
    "header, model",
    [("ghost", None), ("ghost", "base-model"), (None, "ghost")],
)
def test_with_lora_off_an_openai_request_naming_an_adapter_is_a_404_naming_the_served_model(header, model):
    from lmi_server.api.adapters.routing import resolve_adapter

    with pytest.raises(APIError) as err:
        asyncio.run(resolve_adapter(_naming_request(header), _fields(model=model, prompt="x")))
    assert err.value.status == 404 and "'ghost'" in err.value.message and "'base-model'" in err.value.message
    assert "option.enable_lora=false" in err.value.message and err.value.param == "model"


@pytest.mark.parametrize(
    "header, adapters, model",
    [("ghost", None, None), (None, "ghost", None), (None, ["ghost"], None), (None, None, "ghost")],
)
def test_with_lora_off_an_lmi_request_naming_an_adapter_is_a_404(header, adapters, model):
    from lmi_server.api.adapters.routing import resolve_adapter

    with pytest.raises(APIError) as err:
        asyncio.run(resolve_adapter(_naming_request(header), _fields(inputs="x", adapters=adapters, model=model)))
    assert err.value.status == 404 and err.value.body(Shape.LMI)["code"] == 404 and "'ghost'" in err.value.message


def test_with_lora_on_an_unknown_model_is_a_404_naming_the_base_model_and_the_adapters():
    from lmi_server.adapters.registry import AdapterNotFound
    from lmi_server.api.adapters.routing import resolve_adapter

    def get(name):
        raise AdapterNotFound(name, ["pirate", "shouter"])

    with pytest.raises(APIError) as err:
        asyncio.run(resolve_adapter(_naming_request(registry=SimpleNamespace(get=get)), {"model": "ghost", "prompt": "x"}))
    message = err.value.message
    assert err.value.status == 404 and err.value.param == "model"
    assert "'ghost'" in message and "'base-model'" in message and "pirate, shouter" in message


@pytest.mark.parametrize("model", [None, "base-model", "lmi"])
def test_the_base_model_needs_no_adapter(model):
    from lmi_server.api.adapters.routing import resolve_adapter

    assert asyncio.run(resolve_adapter(_naming_request(), _fields(inputs="x", model=model))) is None
    assert asyncio.run(resolve_adapter(_naming_request(), _fields(prompt="x", model=model))) is None


def test_the_adapter_in_use_is_the_model_vllm_is_asked_for():
    from lmi_server.api.pipeline import check_request

    base = _naming_request()
    state = SimpleNamespace(engine=SimpleNamespace(model_config=None), serving=base.app.state.ctx.owner.state.serving)
    base.app.state.ctx.engine_limits = None
    using = SimpleNamespace(app=base.app, scope={"state": {REQUEST_KEY: RequestContext(adapter=AdapterUse("pirate", None))}})
    parsed = SimpleNamespace(model="lmi")
    asyncio.run(check_request(using, parsed, state))
    assert parsed.model == "pirate"
    for model, named in (("base-model", "base-model"), ("lmi", "base-model")):  # "lmi": LMI's name of the base model
        parsed = SimpleNamespace(model=model)
        asyncio.run(check_request(base, parsed, state))
        assert parsed.model == named


def test_the_adapters_field_names_the_adapter_of_any_body():
    from lmi_server.api.adapters.routing import adapter_named, adapters_field

    body = {"model": "base-model", "prompt": "x", "adapters": "pirate"}
    assert adapter_named(_naming_request(), body) == "pirate"
    assert adapter_named(_naming_request(), {**body, "adapters": ["pirate"]}) == "pirate"
    assert adapter_named(_naming_request("shouter"), body) == "shouter"  # the header wins
    assert adapters_field(body) == {"model": "base-model", "prompt": "x"}  # not sent on to vLLM
    lmi_body = {"inputs": "x", "adapters": "pirate"}
    assert adapter_named(_naming_request(), lmi_body) == "pirate"
    assert adapters_field(lmi_body) is lmi_body  # LMI's own schema reads it itself
    with pytest.raises(APIError) as err:
        adapter_named(_naming_request(), {**body, "adapters": ["a", "b"]})
    assert err.value.status == 400 and err.value.param == "adapters"
    assert err.value.status_for(Shape.LMI) == 424 and "one adapter per request" in err.value.message
    with pytest.raises(APIError) as err:
        adapter_named(_naming_request(), {**body, "adapters": 3})
    assert err.value.status_for(Shape.LMI) == 424 and err.value.body(Shape.LMI)["code"] == 424
