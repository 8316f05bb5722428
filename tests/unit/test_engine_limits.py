"""Combinations the running engine would die of are refused with a 400 naming the parameter and
the option: prompt log-probabilities for n > 1 sequences with LoRA on; a seed with sampling on a
CPU engine that prefills prompts in parts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmi_server.api.context import Shape
from lmi_server.api.errors import from_engine_limit
from lmi_server.engine_limits import EngineLimits, UnsupportedCombination, asks_prompt_logprobs, samples_with_seed


def _chat(**kw):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], **kw})


def _completion(**kw):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **kw})


@pytest.mark.parametrize(
    "make, fields, expected",
    [
        (_completion, {}, False),
        (_completion, {"prompt_logprobs": 0}, True),
        (_completion, {"echo": True}, False),
        (_completion, {"echo": True, "logprobs": 0}, True),
        (_completion, {"logprobs": 2}, False),
        (_chat, {}, False),
        (_chat, {"prompt_logprobs": 1}, True),
        (_chat, {"echo": True}, True),  # top_logprobs defaults to 0: vLLM takes the prompt's
        (_chat, {"logprobs": True, "top_logprobs": 3}, False),
    ],
)
def test_which_requests_ask_for_prompt_logprobs(make, fields, expected):
    assert asks_prompt_logprobs(make(**fields)) is expected


@pytest.mark.parametrize(
    "fields, expected",
    [({}, False), ({"seed": 1}, True), ({"seed": 1, "temperature": 0}, False), ({"seed": 1, "temperature": 0.7}, True),
     ({"temperature": 0.7}, False)],
)
def test_which_requests_sample_with_a_seed(fields, expected):
    assert samples_with_seed(_completion(**fields)) is expected


def test_with_lora_several_sequences_with_prompt_logprobs_are_refused_naming_n_and_the_option():
    limits = EngineLimits(lora=True)
    limits.check(_completion(n=2))
    limits.check(_completion(prompt_logprobs=1))
    EngineLimits(lora=False).check(_completion(n=2, prompt_logprobs=1))
    with pytest.raises(UnsupportedCombination) as exc:
        limits.check(_completion(n=2, prompt_logprobs=1))
    assert exc.value.param == "n" and "option.enable_lora" in str(exc.value)
    with pytest.raises(UnsupportedCombination):
        limits.check(_chat(n=3, echo=True))
    error = from_engine_limit(exc.value)
    assert error.status == 400 and error.body(Shape.LMI) == {"error": str(exc.value), "code": 400}


def test_seeded_sampling_is_refused_only_where_the_cpu_engine_chunks_prefills():
    EngineLimits().check(_completion(seed=3, temperature=1.0))
    limits = EngineLimits(seeded_sampling_dies=True)
    limits.check(_completion(seed=3, temperature=0))
    with pytest.raises(UnsupportedCombination) as exc:
        limits.check(_chat(seed=3))
    assert exc.value.param == "seed" and "option.enable_chunked_prefill" in str(exc.value)


def _engine(device, chunked, lora):
    return SimpleNamespace(vllm_config=SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked),
        lora_config=object() if lora else None,
    ))


def test_the_limits_are_read_from_the_engines_configuration():
    assert EngineLimits.of_engine(_engine("cpu", True, False)) == EngineLimits(seeded_sampling_dies=True)
    assert EngineLimits.of_engine(_engine("cpu", False, True)) == EngineLimits(lora=True)
    assert EngineLimits.of_engine(_engine("cuda", True, False)) == EngineLimits()
    assert EngineLimits.of_engine(SimpleNamespace()) == EngineLimits()


def test_sampling_is_refused_on_a_cpu_engine_that_speculates():
    limits = EngineLimits(speculative_sampling_broken=True)
    limits.check(_completion(temperature=0))
    limits.check(_chat(temperature=0, top_k=5))
    for request in (_completion(temperature=0.7), _chat(), _chat(temperature=1.0, top_k=5)):
        with pytest.raises(UnsupportedCombination) as exc:
            limits.check(request)
        assert exc.value.param == "temperature" and "option.speculative_method" in str(exc.value)
    engine = _engine("cpu", False, False)
    engine.vllm_config.speculative_config = object()
    assert EngineLimits.of_engine(engine).speculative_sampling_broken


def test_a_streamed_echo_with_logprobs_of_several_sequences_is_refused():
    limits = EngineLimits()
    limits.check(_completion(n=2, echo=True, logprobs=1))  # not streamed: served
    limits.check(_completion(n=1, echo=True, logprobs=1, stream=True))
    limits.check(_chat(n=2, echo=True, logprobs=True, stream=True))  # chat echoes the last message, no prompt logprobs
    with pytest.raises(UnsupportedCombination) as exc:
        limits.check(_completion(n=2, echo=True, logprobs=0, stream=True))
    assert exc.value.param == "stream"
