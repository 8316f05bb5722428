"""Valid requests for a running server, as hypothesis strategies: each API's generation parameters
in combination, adapters and the base model mixed, streaming and not, sessions, images for a
vision model, embedding batches.

Why valid ones: a request the server should serve exercises the engine (where the crashes are),
an invalid one stops at validation. What the engine cannot serve may still be refused with a 4xx;
only a 5xx, a hang or the engine's death is a failure (`tests/support/fuzz_runner.py`).
Each `Case` names the model or adapter that must answer it.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"

WORDS = (
    "def class return import self value list dict the a of is for in print data model request server "
    "engine token cache if else while try except with as yield lambda None True False 0 1 42 ( ) : , . = +"
).split()
STOPS = ["\n", ".", "def", "return", ")", "the", "STOP"]
PROMPT_UNIT = "value = data "
"""Repeated to build prompts near the context limit (its tokens per copy are measured per server)."""


@dataclass(frozen=True)
class Target:
    """What a server under fuzzing serves (its configuration decides which requests are valid)."""

    name: str
    base_url: str
    model: str
    kind: str = "generate"  # generate | embed
    adapters: tuple[str, ...] = ()
    upper_case_adapters: tuple[str, ...] = ()  # an output formatter upper-cases their answers
    max_model_len: int = 4096
    tools: bool = False  # a tool-call parser is configured
    vision: bool = False
    sessions: bool = True
    greedy: bool = False  # the engine serves only greedy requests (sampling is refused): send mostly those
    tokens_per_unit: float = 4.0  # tokens per PROMPT_UNIT (`fuzz_runner.calibrate`)


@dataclass
class Case:
    """One request: where, what, and which model must answer it."""

    route: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    expect_model: str | None = None  # the `model` field of an OpenAI-shaped answer
    adapter: str | None = None  # the adapter it names (None: the base model)
    upper_case: bool = False  # the answer's text must be upper-case (the adapter's formatter)
    session: int | None = None  # index of an open session to send it in
    session_cycle: bool = False  # open a session, send the request in it, close it

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    def signature(self) -> str:
        """The combination it tries: route, schema, parameter names, adapter or not."""
        body = self.body if isinstance(self.body, dict) else {}
        params = sorted(body.get("parameters", {})) if isinstance(body.get("parameters"), dict) else []
        keys = sorted(k for k in body if k not in ("messages", "prompt", "inputs", "input", "parameters"))
        named = "adapter" if self.adapter else "base"
        session = "cycle" if self.session_cycle else "open" if self.session is not None else "none"
        return f"{self.route}|{'+'.join(keys)}|{'+'.join(params)}|{'+'.join(sorted(self.headers))}|{named}|{session}"


# ---------------------------------------------------------------------------- text


def _words(min_size: int = 1, max_size: int = 40):
    return st.lists(st.sampled_from(WORDS), min_size=min_size, max_size=max_size).map(" ".join)


unicode_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=60
).filter(lambda s: s.strip())


def prompt_text(target: Target):
    """Short word prompts mostly, some unicode, some near the context limit."""
    near = st.integers(min_value=-24, max_value=4).map(
        lambda slack: PROMPT_UNIT * max(1, int((target.max_model_len - 40 + slack) / target.tokens_per_unit))
    )
    return st.one_of(_words(), _words(), _words(), unicode_text, near)


def near_limit_max_tokens(target: Target, prompt: str) -> st.SearchStrategy[int]:
    """max_tokens that brings a long prompt to the context limit, a little below or above it."""
    used = int(len(prompt) / len(PROMPT_UNIT) * target.tokens_per_unit) if prompt.startswith(PROMPT_UNIT) else 0
    if used < target.max_model_len // 2:
        return st.integers(min_value=1, max_value=24)
    room = target.max_model_len - used
    return st.integers(min_value=max(1, room - 8), max_value=max(1, room + 8))


# ---------------------------------------------------------------------------- sampling


def _sampling_openai(chat: bool, stream: bool):
    optional = {
        "temperature": st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.8]),
        "top_p": st.floats(min_value=0.05, max_value=1.0),
        "top_k": st.sampled_from([-1, 1, 5, 50]),
        "min_p": st.floats(min_value=0.0, max_value=0.5),
        "seed": st.integers(min_value=0, max_value=2**31 - 1),
        "presence_penalty": st.floats(min_value=-2.0, max_value=2.0),
        "frequency_penalty": st.floats(min_value=-2.0, max_value=2.0),
        "repetition_penalty": st.floats(min_value=0.5, max_value=2.0),
        "stop": st.one_of(st.sampled_from(STOPS), st.lists(st.sampled_from(STOPS), min_size=1, max_size=3, unique=True)),
        "ignore_eos": st.booleans(),
        "min_tokens": st.integers(min_value=0, max_value=4),
        "n": st.integers(min_value=1, max_value=3),
        "include_stop_str_in_output": st.booleans(),
        "skip_special_tokens": st.booleans(),
        "logit_bias": st.dictionaries(st.integers(min_value=0, max_value=200).map(str), st.floats(-5, 5), max_size=3),
        "prompt_logprobs": st.integers(min_value=0, max_value=0 if stream else 3),
        "echo": st.booleans(),
    }
    if chat:
        optional["logprobs"] = st.booleans()
        optional["top_logprobs"] = st.integers(min_value=0, max_value=5)  # dropped below unless logprobs is true
    else:
        optional["logprobs"] = st.integers(min_value=0, max_value=5)
    if stream:
        optional["stream_options"] = st.fixed_dictionaries({"include_usage": st.booleans()})
    return st.fixed_dictionaries({}, optional=optional).map(_consistent)


def _consistent(params: dict[str, Any]) -> dict[str, Any]:
    """What vLLM requires between parameters: top_logprobs only with logprobs (chat)."""
    if "top_logprobs" in params and params.get("logprobs") is not True:
        del params["top_logprobs"]
    return params


def _greedy_or_sampled(draw, target: Target, body: dict[str, Any], temperature_key: str = "temperature") -> None:
    """Mostly greedy where the engine refuses sampling; several sequences only when sampling."""
    if target.greedy and draw(st.integers(min_value=0, max_value=4)) > 0:
        body[temperature_key] = 0.0
    if body.get(temperature_key, 1.0) == 0:
        body.pop("n", None)


def _bounded_min_tokens(body: dict[str, Any], key_min: str, key_max: str) -> None:
    """min_tokens (min_new_tokens) at most max_tokens (max_new_tokens), as vLLM requires."""
    if key_min in body and key_max in body:
        body[key_min] = min(body[key_min], body[key_max])


STRUCTURED = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name"]}}}},
    {"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    {"structured_outputs": {"regex": "[a-z]{2,8}"}},
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]


def _tools():
    choice = st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}])
    return st.fixed_dictionaries({"tools": st.just(TOOLS)}, optional={"tool_choice": choice})


# ---------------------------------------------------------------------------- who answers


def _naming(target: Target):
    """(how the model is named, adapter or None): by `model`, the LMI `adapters` field, the header,
    or not at all (the base model)."""
    names = [None, *target.adapters]
    return st.tuples(st.sampled_from(["model", "adapters", "header", "none"]), st.sampled_from(names))


def _apply_naming(case: Case, how: str, adapter: str | None, target: Target, *, lmi: bool) -> Case:
    body = case.body
    if adapter is None:
        if not lmi and how == "model":
            body["model"] = target.model
        elif lmi and how == "model":
            body["model"] = "lmi"  # LMI's name for the base model
    elif how == "header":
        case.headers[ADAPTER_HEADER] = adapter
    elif how == "adapters" and case.route == "/invocations":
        body["adapters"] = adapter
    elif how == "adapters" and not lmi:
        body["adapters"] = [adapter]
    else:
        body["model"] = adapter
    if not lmi and "model" not in body and case.route != "/invocations":
        body["model"] = target.model
    case.expect_model = adapter or target.model
    case.adapter = adapter
    case.upper_case = adapter in target.upper_case_adapters
    return case


# ---------------------------------------------------------------------------- the generate kind


@functools.lru_cache(maxsize=None)
def _image_part(colour: str, shape: str) -> dict:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (64, 64), "white")
    draw = ImageDraw.Draw(img)
    box = (14, 14, 50, 50)
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def _messages(target: Target):
    text = prompt_text(target)
    turn = st.fixed_dictionaries({"role": st.just("user"), "content": text})
    plain = st.lists(turn, min_size=1, max_size=2)
    with_system = st.tuples(_words(max_size=12), text).map(
        lambda p: [{"role": "system", "content": p[0]}, {"role": "user", "content": p[1]}]
    )
    if not target.vision:
        return st.one_of(plain, with_system)
    picture = st.tuples(
        st.sampled_from(["red", "blue", "green"]), st.sampled_from(["circle", "square"]),
        st.sampled_from(["What colour is the shape?", "What shape is it?", "Describe the figure."]),
        st.integers(min_value=1, max_value=2),
    ).map(lambda p: [{"role": "user", "content": [_image_part(p[0], p[1]) for _ in range(p[3])] + [{"type": "text", "text": p[2]}]}])
    return st.one_of(plain, picture, picture)


@st.composite
def chat_case(draw, target: Target, route: str = "/v1/chat/completions") -> Case:
    stream = draw(st.booleans())
    body: dict[str, Any] = {"messages": draw(_messages(target)), **draw(_sampling_openai(True, stream))}
    if stream:
        body["stream"] = True
    extra = draw(st.sampled_from(["none", "none", "structured"] + (["tools", "tools"] if target.tools else [])))
    if extra == "structured":
        body.update(draw(st.sampled_from(STRUCTURED)))
    elif extra == "tools":
        body.update(draw(_tools()))
    last = body["messages"][-1]["content"]
    body["max_tokens"] = draw(near_limit_max_tokens(target, last if isinstance(last, str) else ""))
    _bounded_min_tokens(body, "min_tokens", "max_tokens")
    _greedy_or_sampled(draw, target, body)
    how, adapter = draw(_naming(target))
    case = _apply_naming(Case(route, body), how, adapter, target, lmi=False)
    if route == "/invocations" and target.sessions:
        _draw_session(draw, case)
    return case


@st.composite
def completion_case(draw, target: Target, route: str = "/v1/completions") -> Case:
    stream = draw(st.booleans())
    prompt = draw(st.one_of(prompt_text(target), st.lists(_words(), min_size=2, max_size=3)))
    body: dict[str, Any] = {"prompt": prompt, **draw(_sampling_openai(False, stream))}
    if stream:
        body["stream"] = True
    if draw(st.integers(min_value=0, max_value=5)) == 0:
        body.update(draw(st.sampled_from(STRUCTURED)))
    body["max_tokens"] = draw(near_limit_max_tokens(target, prompt if isinstance(prompt, str) else ""))
    _bounded_min_tokens(body, "min_tokens", "max_tokens")
    _greedy_or_sampled(draw, target, body)
    how, adapter = draw(_naming(target))
    case = _apply_naming(Case(route, body), how, adapter, target, lmi=False)
    if route == "/invocations" and target.sessions:
        _draw_session(draw, case)
    return case


def _lmi_parameters(stream: bool):
    optional = {
        "do_sample": st.booleans(),
        "temperature": st.sampled_from([0.1, 0.7, 1.0, 1.5]),
        "top_p": st.floats(min_value=0.05, max_value=1.0),
        "top_k": st.sampled_from([-1, 1, 5, 50]),
        "seed": st.integers(min_value=0, max_value=2**31 - 1),
        "repetition_penalty": st.floats(min_value=0.5, max_value=2.0),
        "stop_sequences": st.lists(st.sampled_from(STOPS), min_size=1, max_size=3, unique=True),
        "details": st.booleans(),
        "return_full_text": st.booleans(),
        "top_n_tokens": st.integers(min_value=0, max_value=5),
        "ignore_eos_token": st.booleans(),
        "min_new_tokens": st.integers(min_value=0, max_value=4),
        "n": st.integers(min_value=1, max_value=3),
        "min_p": st.floats(min_value=0.0, max_value=0.5),
    }
    if not stream:
        optional["decoder_input_details"] = st.booleans()
    return st.fixed_dictionaries({"max_new_tokens": st.integers(min_value=1, max_value=24)}, optional=optional)


@st.composite
def lmi_case(draw, target: Target) -> Case:
    stream = draw(st.booleans())
    inputs = draw(prompt_text(target)) if stream else draw(st.one_of(prompt_text(target), st.lists(_words(), min_size=1, max_size=3)))
    parameters = draw(_lmi_parameters(stream))
    if parameters.get("decoder_input_details"):
        parameters["details"] = True
    if isinstance(inputs, str) and inputs.startswith(PROMPT_UNIT):
        parameters["max_new_tokens"] = draw(near_limit_max_tokens(target, inputs))
    _bounded_min_tokens(parameters, "min_new_tokens", "max_new_tokens")
    if parameters.get("n", 1) > 1 and not target.greedy:
        parameters["do_sample"] = True  # several sequences need sampling
    elif target.greedy and draw(st.integers(min_value=0, max_value=4)) > 0:
        for key in ("do_sample", "temperature", "top_p", "top_k", "n"):
            parameters.pop(key, None)
    body: dict[str, Any] = {"inputs": inputs, "parameters": parameters}
    if stream:
        body["stream"] = True
    how, adapter = draw(_naming(target))
    case = _apply_naming(Case("/invocations", body), how, adapter, target, lmi=True)
    case.expect_model = None  # LMI's answer names no model: checked by property where an adapter has one
    if target.sessions:
        _draw_session(draw, case)
    return case


def _draw_session(draw, case: Case) -> None:
    kind = draw(st.sampled_from(["none", "none", "open", "cycle"]))
    if kind == "open":
        case.session = draw(st.integers(min_value=0, max_value=3))
    elif kind == "cycle":
        case.session_cycle = True


def _naming_by_model_or_header(target: Target):
    """Who answers a door whose body has no LMI `adapters` field (Anthropic Messages, tokenize)."""
    return st.tuples(st.sampled_from(["model", "header", "none"]), st.sampled_from([None, *target.adapters]))


@st.composite
def responses_case(draw, target: Target) -> Case:
    """OpenAI's Responses API (vLLM's handler): text or message input, streamed or not."""
    stream = draw(st.booleans())
    text = draw(prompt_text(target))
    body: dict[str, Any] = {"input": draw(st.sampled_from([text, [{"role": "user", "content": text}]]))}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "instructions": _words(max_size=10),
        "temperature": st.sampled_from([0.0, 0.5, 1.0]),
        "top_p": st.floats(min_value=0.1, max_value=1.0),
        "store": st.booleans(),
    })))
    body["max_output_tokens"] = draw(near_limit_max_tokens(target, text))
    if stream:
        body["stream"] = True
    _greedy_or_sampled(draw, target, body)
    how, adapter = draw(_naming(target))
    return _apply_naming(Case("/v1/responses", body), how, adapter, target, lmi=False)


@st.composite
def messages_case(draw, target: Target) -> Case:
    """Anthropic's Messages API (vLLM's handler): system prompt, stop sequences, streamed or not."""
    stream = draw(st.booleans())
    text = draw(prompt_text(target))
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "system": _words(max_size=10),
        "temperature": st.sampled_from([0.0, 0.5, 1.0]),
        "top_p": st.floats(min_value=0.1, max_value=1.0),
        "top_k": st.sampled_from([1, 5, 50]),
        "stop_sequences": st.lists(st.sampled_from(STOPS), min_size=1, max_size=2, unique=True),
    })))
    body["max_tokens"] = draw(near_limit_max_tokens(target, text))
    if stream:
        body["stream"] = True
    _greedy_or_sampled(draw, target, body)
    how, adapter = draw(_naming_by_model_or_header(target))
    return _apply_naming(Case("/v1/messages", body), how, adapter, target, lmi=False)


@st.composite
def tokenize_case(draw, target: Target) -> Case:
    """vLLM's /tokenize (a prompt or chat messages) and, on a generating model, /v1/embeddings
    (refused with a 4xx: it is not a pooling model) beside the generations."""
    text = draw(prompt_text(target))
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        return Case("/v1/embeddings", {"model": target.model, "input": text})
    body: dict[str, Any] = draw(st.sampled_from([{"prompt": text}, {"messages": [{"role": "user", "content": text}]}]))
    if draw(st.booleans()):
        body["add_special_tokens"] = draw(st.booleans())
    how, adapter = draw(_naming_by_model_or_header(target))
    case = _apply_naming(Case("/tokenize", body), how, adapter, target, lmi=False)
    case.upper_case = False  # token ids, no text
    case.expect_model = None
    return case


# ---------------------------------------------------------------------------- the embed kind


@st.composite
def embedding_case(draw, target: Target) -> Case:
    near = st.integers(min_value=-40, max_value=8).map(
        lambda slack: PROMPT_UNIT * max(1, int((target.max_model_len + slack) / target.tokens_per_unit))
    )
    texts = st.one_of(_words(), _words(), unicode_text, near)
    route = draw(st.sampled_from(["/v1/embeddings", "/v1/embeddings", "/invocations", "/score", "/rerank"]))
    if route == "/v1/embeddings":
        body: dict[str, Any] = {"model": target.model, "input": draw(st.one_of(texts, st.lists(texts, min_size=1, max_size=16)))}
        body.update(draw(st.fixed_dictionaries({}, optional={
            "encoding_format": st.sampled_from(["float", "base64"]),
            "truncate_prompt_tokens": st.sampled_from([-1, 8, 64]),
        })))
        return Case(route, body, expect_model=target.model)
    if route == "/invocations":
        body = {"inputs": draw(st.one_of(texts, st.lists(texts, min_size=1, max_size=16)))}
        if draw(st.booleans()):
            body["parameters"] = {"truncate_prompt_tokens": draw(st.sampled_from([-1, 8, 64]))}
        return Case(route, body)
    if route == "/score":
        return Case(route, {"model": target.model, "text_1": draw(texts), "text_2": draw(st.one_of(texts, st.lists(texts, min_size=1, max_size=8)))},
                    expect_model=target.model)
    return Case(route, {"model": target.model, "query": draw(texts), "documents": draw(st.lists(texts, min_size=1, max_size=8))},
                expect_model=target.model)


# ---------------------------------------------------------------------------- batches


def case_strategy(target: Target) -> st.SearchStrategy[Case]:
    if target.kind == "embed":
        return embedding_case(target)
    return st.one_of(
        lmi_case(target), lmi_case(target),
        chat_case(target), chat_case(target, "/invocations"),
        completion_case(target), completion_case(target, "/invocations"),
        responses_case(target), messages_case(target), tokenize_case(target),
    )


def batches(target: Target) -> st.SearchStrategy[list[Case]]:
    """Requests sent together: 1, 2, 4 or 8 of them."""
    return st.sampled_from([1, 2, 4, 8]).flatmap(lambda n: st.lists(case_strategy(target), min_size=n, max_size=n))
