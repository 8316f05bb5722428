"""Combinations of request parameters that vLLM 0.32 cannot serve with the options its engine runs
with, refused before they reach it (a 400 that names the parameter and the option), because the
engine would die of them and take every other request with it.

- LoRA on, prompt log-probabilities for several sequences of one request (`n > 1`): vLLM computes
  a step's prompt log-probabilities through the LoRA logits processor with one adapter index per
  request, not per prompt token; one request alone is served (`prefill_gate` makes it alone),
  several sequences of one request prefill in the same step.
- CPU engine with chunked prefill, a seed with sampling: a seeded request's discarded sample (a
  prompt prefilled in parts) is undone with `Generator.set_offset`, which CPU generators lack. The
  server runs CPU engines without chunked prefill unless told otherwise (`runtime`), so this only
  applies where option.enable_chunked_prefill=true (or a step budget below max_model_len) was set.
- CPU engine with speculative decoding, sampling (a temperature above 0, or unset: the model's
  default, 1.0 for the built-in models): vLLM's CPU rejection sampler spreads each request's
  temperature, top_p and top_k over its draft tokens with a kernel that writes only int64
  tensors, so they stay uninitialized memory: answers are sampled at random settings, and a
  top_k read from that memory indexes out of bounds and kills the engine. Greedy requests never
  read them.
- Streamed completions with echo, logprobs and n > 1: vLLM sends the prompt's log-probabilities
  with the first sequence only and fails on the others (a KeyError in its stream, a 500 event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnsupportedCombination(ValueError):
    """What the engine cannot serve with its options; api/errors.py answers 400 naming `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def asks_prompt_logprobs(request: Any) -> bool:
    """Whether vLLM will compute prompt log-probabilities for this chat or completion request:
    `prompt_logprobs`, or `echo` with the log-probabilities that vLLM then takes for the prompt
    (chat: `top_logprobs`, which defaults to 0; completion: `logprobs`)."""
    if getattr(request, "prompt_logprobs", None) is not None:
        return True
    if not getattr(request, "echo", False):
        return False
    field = "top_logprobs" if hasattr(request, "messages") else "logprobs"
    return getattr(request, field, None) is not None


def echoes_logprobs(request: Any) -> bool:
    """A completion request whose echoed prompt carries log-probabilities."""
    return not hasattr(request, "messages") and bool(getattr(request, "echo", False)) and getattr(request, "logprobs", None) is not None


def samples(request: Any) -> bool:
    """A temperature that is not 0 (unset: the model's default, which samples)."""
    temperature = getattr(request, "temperature", None)
    return temperature is None or temperature > 0


def samples_with_seed(request: Any) -> bool:
    """A seed and a temperature that is not 0 (unset: the model's default, which samples)."""
    if getattr(request, "seed", None) is None:
        return False
    temperature = getattr(request, "temperature", None)
    return temperature is None or temperature > 0


@dataclass(frozen=True)
class EngineLimits:
    """What the running engine cannot serve, read from its own configuration once it is built."""

    lora: bool = False
    seeded_sampling_dies: bool = False
    speculative_sampling_broken: bool = False

    @classmethod
    def of_engine(cls, engine: Any) -> "EngineLimits":
        config = getattr(engine, "vllm_config", None)
        device = getattr(getattr(config, "device_config", None), "device_type", None)
        chunked = bool(getattr(getattr(config, "scheduler_config", None), "enable_chunked_prefill", False))
        return cls(
            lora=getattr(config, "lora_config", None) is not None,
            seeded_sampling_dies=device == "cpu" and chunked,
            speculative_sampling_broken=device == "cpu" and getattr(config, "speculative_config", None) is not None,
        )

    def check(self, request: Any) -> None:
        """Raise UnsupportedCombination for a request this engine would die of (or answer wrongly)."""
        n = getattr(request, "n", None) or 1
        if n > 1 and getattr(request, "stream", False) and echoes_logprobs(request):
            raise UnsupportedCombination(
                f"echo with logprobs and n={n} cannot be streamed: vLLM sends the prompt's log-probabilities with "
                "the first sequence only (see the known limits in docs/reliability.md); send stream=false, or n=1",
                "stream",
            )
        if self.speculative_sampling_broken and samples(request):
            raise UnsupportedCombination(
                "sampling (a temperature above 0; unset is the model's default, 1.0) is not supported with speculative "
                "decoding (option.speculative_method / option.speculative_config) on a CPU engine: vLLM 0.32's CPU "
                "rejection sampler leaves each request's temperature, top_p and top_k unset (see the known limits in "
                "docs/reliability.md); send temperature 0 (greedy; LMI: do_sample false), or serve without speculative decoding",
                "temperature",
            )
        if self.lora and n > 1 and asks_prompt_logprobs(request):
            raise UnsupportedCombination(
                f"prompt log-probabilities (prompt_logprobs, decoder_input_details, or echo with logprobs) with n={n} "
                "are not supported while option.enable_lora=true: vLLM computes them for one sequence at a time only "
                "(see the known limits in docs/reliability.md); send n=1, or n requests",
                "n",
            )
        if self.seeded_sampling_dies and samples_with_seed(request):
            raise UnsupportedCombination(
                "seed with sampling (a temperature above 0) is not supported on this CPU engine while "
                "option.enable_chunked_prefill=true: vLLM 0.32 cannot rewind a CPU random generator for a prompt "
                "prefilled in parts (see the known limits in docs/reliability.md); leave option.enable_chunked_prefill "
                "unset "
                "(prompts are then prefilled whole), or send no seed, or temperature 0",
                "seed",
            )
