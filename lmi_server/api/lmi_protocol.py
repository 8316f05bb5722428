"""The LMI/TGI request schema (`{"inputs": ..., "parameters": {...}}`) and its translation.

An LMI request becomes a vLLM CompletionRequest, so validation, tokenization, length checks and
sampling are vLLM's; only the envelope differs. Responses follow LMI: `{"generated_text": ...}`
(a list for a list of inputs), `details` on request, jsonlines when streaming.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class LMIParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(30, ge=1, description="Tokens to generate (LMI's default: 30).")
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    do_sample: bool | None = None
    repetition_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: list[str] | None = None
    stop_sequences: list[str] | None = None
    seed: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    ignore_eos: bool = False
    min_new_tokens: int | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1, le=16)
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

    @field_validator("inputs")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and any(not isinstance(v, str) or not v for v in value):
            raise ValueError("every input must be a non-empty string")
        if isinstance(value, str) and not value:
            raise ValueError("inputs must not be empty")
        return value


def to_completion_body(req: LMIRequest, model: str | None) -> dict[str, Any]:
    """LMI parameters -> an OpenAI completion body for vLLM's serving layer."""
    p = req.parameters
    sampling_asked = any(v is not None for v in (p.temperature, p.top_p, p.top_k))
    do_sample = p.do_sample if p.do_sample is not None else sampling_asked
    body: dict[str, Any] = {
        "prompt": req.inputs,
        "max_tokens": p.max_new_tokens,
        "stream": req.stream,
        "return_token_ids": True,
        "ignore_eos": p.ignore_eos,
    }
    if model:
        body["model"] = model
    if do_sample:
        body["temperature"] = 1.0 if p.temperature is None else p.temperature
        if p.top_p is not None:
            body["top_p"] = p.top_p
        if p.top_k is not None:
            body["top_k"] = p.top_k
    else:
        body["temperature"] = 0.0
    for src, dst in (
        ("repetition_penalty", "repetition_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("seed", "seed"),
        ("min_new_tokens", "min_tokens"),
        ("n", "n"),
    ):
        value = getattr(p, src)
        if value is not None:
            body[dst] = value
    stops = (p.stop or []) + (p.stop_sequences or [])
    if stops:
        body["stop"] = stops
    if p.details or req.stream:
        body["logprobs"] = max(1, p.top_n_tokens or 0) if p.details else None
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return {k: v for k, v in body.items() if v is not None}


def _details(choice: dict[str, Any], usage: dict[str, Any] | None, prompt: str) -> dict[str, Any]:
    tokens = []
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids") or []
    texts = logprobs.get("tokens") or []
    lps = logprobs.get("token_logprobs") or []
    for i, text in enumerate(texts):
        tokens.append({"id": ids[i] if i < len(ids) else None, "text": text, "log_prob": lps[i] if i < len(lps) else None})
    return {
        "finish_reason": {"stop": "eos_token", "length": "length"}.get(choice.get("finish_reason"), choice.get("finish_reason")),
        "generated_tokens": len(ids),
        "inputs": prompt,
        "tokens": tokens,
    }


def format_response(req: LMIRequest, completion: dict[str, Any]) -> Any:
    """vLLM completion response -> LMI response (dict, or list of dicts for a list of inputs)."""
    prompts = req.inputs if isinstance(req.inputs, list) else [req.inputs]
    n = req.parameters.n or 1
    results = []
    for choice in sorted(completion["choices"], key=lambda c: c["index"]):
        prompt = prompts[choice["index"] // n]
        text = choice["text"]
        item: dict[str, Any] = {"generated_text": (prompt + text) if req.parameters.return_full_text else text}
        if req.parameters.details:
            item["details"] = _details(choice, completion.get("usage"), prompt)
        results.append(item)
    return results if isinstance(req.inputs, list) else results[0]


async def stream_jsonlines(req: LMIRequest, sse: AsyncIterator[str]) -> AsyncIterator[str]:
    """vLLM's SSE completion chunks -> LMI jsonlines: one token line each, then the full text."""
    prompt = req.inputs if isinstance(req.inputs, str) else req.inputs[0]
    generated: list[str] = []
    finish_reason = None
    count = 0
    async for event in sse:
        for line in event.splitlines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :].strip()
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                yield json.dumps({"error": chunk["error"].get("message", str(chunk["error"])), "code": 424}) + "\n"
                return
            for choice in chunk.get("choices", []):
                text = choice.get("text") or ""
                ids = choice.get("token_ids") or []
                count += len(ids)
                generated.append(text)
                lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
                finish_reason = choice.get("finish_reason") or finish_reason
                if text or ids:
                    token = {"id": ids[0] if len(ids) == 1 else ids, "text": text, "log_prob": lps[0] if len(lps) == 1 else (lps or None)}
                    yield json.dumps({"token": token, "generated_text": None}) + "\n"
    full = "".join(generated)
    final: dict[str, Any] = {
        "token": None,
        "generated_text": (prompt + full) if req.parameters.return_full_text else full,
    }
    if req.parameters.details:
        final["details"] = {
            "finish_reason": {"stop": "eos_token"}.get(finish_reason, finish_reason),
            "generated_tokens": count,
            "inputs": prompt,
        }
    yield json.dumps(final) + "\n"
