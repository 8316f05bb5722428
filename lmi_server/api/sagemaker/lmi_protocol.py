"""The LMI/TGI request schema (`{"inputs": ..., "parameters": {...}}`) and its translation.

An LMI request becomes a vLLM CompletionRequest, so validation, tokenization, length checks and
sampling are vLLM's; only the envelope differs. As in LMI's vLLM handler, `parameters` pass
through to vLLM's sampling parameters; LMI's own names are renamed first (`max_new_tokens`,
`stop_sequences`, `ignore_eos_token`, `truncate`, `min_new_tokens`) and its switches
(`do_sample`, `details`, `decoder_input_details`, `return_full_text`, `top_n_tokens`) shape the
request and the response. A name that is neither LMI's nor vLLM's is a 400 that names it.

Responses follow LMI's documented schema: `{"generated_text": ...}` (a list for a list of
inputs), `details` on request (`finish_reason` one of `length`, `eos_token`, `stop_sequence`;
`tokens` with `log_prob`; `prefill` with `decoder_input_details`), and when streaming jsonlines
with one `{"token": ...}` line per step whose last line also carries `generated_text` and
`details`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# LMI's parameter names -> vLLM's.
RENAMED = {
    "max_new_tokens": "max_tokens",
    "stop_sequences": "stop",
    "ignore_eos_token": "ignore_eos",
    "truncate": "truncate_prompt_tokens",
    "min_new_tokens": "min_tokens",
}
# Set by the envelope, not by `parameters`.
ENVELOPE = {"model", "prompt", "stream", "stream_options", "echo", "return_token_ids", "suffix"}


class ParameterError(ValueError):
    """A generation parameter that vLLM cannot take (its name is in `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class LMIParameters(BaseModel):
    """LMI's own generation parameters; any other name passes through to vLLM (checked later)."""

    model_config = ConfigDict(extra="allow")

    max_new_tokens: int = Field(30, ge=1, description="Tokens to generate (LMI's default: 30).")
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    do_sample: bool | None = None
    stop: list[str] | None = None
    stop_sequences: list[str] | None = None
    seed: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int | None = Field(None, ge=0, le=20)

    @field_validator("stop", "stop_sequences", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class LMIRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: str | list[str] = Field(min_length=1)
    parameters: LMIParameters = Field(default_factory=LMIParameters)
    stream: bool = False
    adapters: str | list[str] | None = None
    model: str | None = None  # LMI fills in its served name; an adapter's name picks the adapter

    @field_validator("inputs")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and any(not isinstance(v, str) or not v for v in value):
            raise ValueError("every input must be a non-empty string")
        if isinstance(value, str) and not value:
            raise ValueError("inputs must not be empty")
        return value


def to_completion_body(req: LMIRequest, model: str | None, vllm_fields: Iterable[str] | None = None) -> dict[str, Any]:
    """LMI parameters -> an OpenAI completion body for vLLM's serving layer. `vllm_fields` are the
    names vLLM's CompletionRequest takes; a parameter outside them (and LMI's) is a ParameterError."""
    p = req.parameters
    extra = dict(p.model_extra or {})
    if p.decoder_input_details and req.stream:
        raise ParameterError("decoder_input_details", "parameters.decoder_input_details cannot be used with streaming")
    body: dict[str, Any] = {"prompt": req.inputs, "max_tokens": p.max_new_tokens, "stream": req.stream, "return_token_ids": True}
    if model:
        body["model"] = model
    sampling_asked = any(v is not None for v in (p.temperature, p.top_p, p.top_k))
    do_sample = p.do_sample if p.do_sample is not None else sampling_asked
    if do_sample:
        body["temperature"] = 1.0 if p.temperature is None else p.temperature
        if p.top_p is not None:
            body["top_p"] = p.top_p
        if p.top_k is not None:
            body["top_k"] = p.top_k
    else:
        body["temperature"] = 0.0
    if p.seed is not None:
        body["seed"] = p.seed
    stops = (p.stop or []) + (p.stop_sequences or [])
    if stops:
        body["stop"] = stops
    allowed = set(vllm_fields) if vllm_fields is not None else None
    for name, value in extra.items():
        target = RENAMED.get(name, name)
        if target in ENVELOPE or (allowed is not None and target not in allowed):
            where = "is set by the request, not by parameters" if target in ENVELOPE else "is not a generation parameter"
            raise ParameterError(name, f"parameters.{name} {where} (LMI's and vLLM's sampling parameters are accepted)")
        if target == "stop":
            value = [value] if isinstance(value, str) else value
            body["stop"] = (body.get("stop") or []) + list(value or [])
            continue
        body[target] = value
    # Log probabilities: one per generated token whenever they are shown (details, every streamed
    # token), more with top_n_tokens; the prompt's with decoder_input_details (LMI: with details).
    wanted = max(1, p.top_n_tokens or 0) if (p.details or req.stream) else None
    if wanted is not None and body.get("logprobs") is None:
        body["logprobs"] = wanted
    if p.details and p.decoder_input_details and body.get("prompt_logprobs") is None:
        body["prompt_logprobs"] = 1
    if req.stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return {k: v for k, v in body.items() if v is not None}


def finish_reason(choice: dict[str, Any]) -> str | None:
    """vLLM's finish_reason/stop_reason -> LMI's (`length`, `eos_token`, `stop_sequence`)."""
    reason = choice.get("finish_reason")
    if reason == "stop":
        return "stop_sequence" if choice.get("stop_reason") is not None else "eos_token"
    if reason == "abort":
        return "error"
    return reason


def _token(token_id: Any, text: str, log_prob: Any) -> dict[str, Any]:
    return {"id": token_id, "text": text, "log_prob": log_prob}


def _tokens(choice: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids") or []
    texts = logprobs.get("tokens") or []
    lps = logprobs.get("token_logprobs") or []
    return [_token(ids[i] if i < len(ids) else None, text, lps[i] if i < len(lps) else None) for i, text in enumerate(texts)]


def _prefill(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt's tokens with their log probabilities (the first has none: nothing precedes it)."""
    ids = choice.get("prompt_token_ids") or []
    entries = choice.get("prompt_logprobs") or []
    out = []
    for i, token_id in enumerate(ids):
        entry = entries[i] if i < len(entries) else None
        found = None
        if isinstance(entry, dict):
            found = entry.get(token_id, entry.get(str(token_id)))
            if found is None and entry:
                found = next(iter(entry.values()))
        text = (found or {}).get("decoded_token") if isinstance(found, dict) else None
        out.append(_token(token_id, text if text is not None else "", (found or {}).get("logprob") if isinstance(found, dict) else None))
    return out


def _details(req: LMIRequest, choice: dict[str, Any], prompt: str) -> dict[str, Any]:
    details = {
        "finish_reason": finish_reason(choice),
        "generated_tokens": len(choice.get("token_ids") or []),
        "inputs": prompt,
        "tokens": _tokens(choice),
    }
    if req.parameters.seed is not None:
        details["seed"] = req.parameters.seed
    if req.parameters.decoder_input_details:
        details["prefill"] = _prefill(choice)
    return details


def format_response(req: LMIRequest, completion: dict[str, Any]) -> Any:
    """vLLM completion response -> LMI response (dict, or list of dicts for a list of inputs)."""
    prompts = req.inputs if isinstance(req.inputs, list) else [req.inputs]
    n = int((req.parameters.model_extra or {}).get("n") or 1)
    results = []
    for choice in sorted(completion["choices"], key=lambda c: c["index"]):
        prompt = prompts[min(choice["index"] // n, len(prompts) - 1)]
        text = choice["text"]
        item: dict[str, Any] = {"generated_text": (prompt + text) if req.parameters.return_full_text else text}
        if req.parameters.details:
            item["details"] = _details(req, choice, prompt)
        results.append(item)
    return results if isinstance(req.inputs, list) else results[0]


def sse_data(event: str) -> list[str]:
    """The `data:` payloads of one or more SSE events."""
    return [line[len("data:") :].strip() for line in event.splitlines() if line.startswith("data:")]


def error_line(message: str, code: int = 424) -> str:
    """LMI's streamed error: a last line whose details say `error` (what LMI's clients check),
    with the message and code beside it."""
    return json.dumps({
        "token": {"id": -1, "text": "", "log_prob": -1, "special_token": True},
        "generated_text": "",
        "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None},
        "error": message,
        "code": code,
    }) + "\n"


async def stream_jsonlines(req: LMIRequest, sse: AsyncIterator[str]) -> AsyncIterator[str]:
    """vLLM's SSE completion chunks -> LMI jsonlines: one token line per engine step; the line of
    the step that finishes also carries `generated_text` (and `details` when asked)."""
    prompt = req.inputs if isinstance(req.inputs, str) else req.inputs[0]
    generated: list[str] = []
    count = 0
    finished = False
    usage: dict[str, Any] = {}

    def closing(line: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
        full = "".join(generated)
        line["generated_text"] = (prompt + full) if req.parameters.return_full_text else full
        if req.parameters.details:
            line["details"] = {
                "finish_reason": finish_reason(choice),
                "generated_tokens": count,
                "inputs": prompt,
                "input_length": usage.get("prompt_tokens"),
            }
            if req.parameters.seed is not None:
                line["details"]["seed"] = req.parameters.seed
        return line

    async for event in sse:
        for data in sse_data(event):
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                err = chunk["error"]
                message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                yield error_line(message)
                return
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice.get("text") or ""
                ids = choice.get("token_ids") or []
                lps = [lp for lp in ((choice.get("logprobs") or {}).get("token_logprobs") or []) if lp is not None]
                count += len(ids)
                generated.append(text)
                done = choice.get("finish_reason") is not None
                if not (text or ids or done):
                    continue
                token = _token(ids[0] if len(ids) == 1 else (ids or -1), text, sum(lps) if lps else None)
                line: dict[str, Any] = {"index": choice.get("index", 0), "token": token, "generated_text": None, "details": None}
                if done:
                    finished = True
                    line = closing(line, choice)
                yield json.dumps(line) + "\n"
    if not finished:  # the engine ended the stream without a finish reason
        yield error_line("generation ended without a finish reason", 500)


def tgi_list(response: Any) -> list[Any]:
    """`option.tgi_compat`: TGI answers a non-streamed request with a list."""
    return response if isinstance(response, list) else [response]


async def as_sse(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """`option.tgi_compat`: the same lines as server-sent events (`data:` prefixed)."""
    async for line in lines:
        yield "data: " + line.rstrip("\n") + "\n\n"
