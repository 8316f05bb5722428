"""Suffix decoding (`option.speculative_method=suffix`): vLLM's `method: suffix`, which drafts from
suffix trees over the prompt and over earlier responses (Arctic Inference's `SuffixDecodingCache`).

Why its own module: it needs no draft model but a compiled extension that PyPI ships only as source
(`scripts/build_suffix_decoding.py`), its own knobs (vLLM's `suffix_decoding_*`), and a refusal of
Arctic Inference's vLLM plugin, which would patch vLLM when switched on. The defaults are vLLM's for the
suffix keys, with the draft capped at this server's 16 tokens; with them the agent-loop benchmark
(benchmarks/agent_loop.py, results/agent_loop.json, one run) measured 3.33x / 1.40x the tokens/s of no
speculation at 1 / 16 clients. No grid over the suffix keys has been run yet.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

SUFFIX_SPECULATIVE_TOKENS = 16
"""Most tokens drafted in one step when option.num_speculative_tokens is unset (vLLM's own default is the
tree depth, 24). Suffix decoding drafts only as far as a match predicts (`max_spec_factor` x match length,
tokens at `min_token_prob` or better), so this is a cap, not a fixed draft."""
SUFFIX_DEFAULTS: dict[str, Any] = {
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}
"""vLLM's defaults, written out so that `lmi-server config` shows what the engine runs with."""
PLUGIN_SWITCH = "ARCTIC_INFERENCE_ENABLED"


class SuffixConfigError(ValueError):
    pass


def apply_defaults(out: dict[str, Any], tokens_given: bool) -> None:
    """Fill a convenience-key config (`option.speculative_method=suffix`) with the measured defaults."""
    if not tokens_given:
        out["num_speculative_tokens"] = SUFFIX_SPECULATIVE_TOKENS
    for key, value in SUFFIX_DEFAULTS.items():
        out.setdefault(key, value)


def _number(wanted: Mapping[str, Any], key: str, kind: type) -> Any:
    value = wanted.get(key, SUFFIX_DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise SuffixConfigError(f"{key}={value!r}: expected {'a number' if kind is float else 'an integer'}")
    return value


def check(wanted: Mapping[str, Any]) -> None:
    """vLLM's own rules for the suffix keys, and ours: no draft model, no batch-size schedule (vLLM's
    suffix proposer asserts a fixed token count), a draft no longer than the tree is deep."""
    depth = _number(wanted, "suffix_decoding_max_tree_depth", int)
    if depth < 1:
        raise SuffixConfigError(f"suffix_decoding_max_tree_depth={depth}: must be at least 1 (default 24)")
    cached = _number(wanted, "suffix_decoding_max_cached_requests", int)
    if cached < 0:
        raise SuffixConfigError(
            f"suffix_decoding_max_cached_requests={cached}: must be 0 (prompt trees only) or more (default 10000)")
    factor = _number(wanted, "suffix_decoding_max_spec_factor", float)
    if factor < 0:
        raise SuffixConfigError(f"suffix_decoding_max_spec_factor={factor}: must be 0 or more (default 1.0)")
    prob = _number(wanted, "suffix_decoding_min_token_prob", float)
    if not 0 <= prob <= 1:
        raise SuffixConfigError(f"suffix_decoding_min_token_prob={prob}: must be from 0 to 1 (default 0.1)")
    if wanted.get("model") not in (None, "suffix"):
        raise SuffixConfigError("speculative method 'suffix' drafts from its own suffix trees: give no draft model")
    if wanted.get("num_speculative_tokens_per_batch_size") is not None:
        raise SuffixConfigError(
            "num_speculative_tokens_per_batch_size is not supported with method 'suffix' (vLLM's suffix proposer "
            "drafts a fixed maximum); it already drafts only where a suffix matches")
    n = wanted.get("num_speculative_tokens")
    if isinstance(n, int) and n > depth:
        raise SuffixConfigError(
            f"num_speculative_tokens={n} exceeds suffix_decoding_max_tree_depth={depth}: a suffix draft never "
            "grows past the tree depth; lower num_speculative_tokens or deepen the tree")
    if not available():
        raise SuffixConfigError(
            "speculative method 'suffix' needs Arctic Inference's suffix-decoding extension, which is not installed: "
            "run `python scripts/build_suffix_decoding.py` in this environment (`make setup` and the images do)")


def available() -> bool:
    """Whether `arctic_inference.suffix_decoding` can be found (without importing its extension)."""
    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except (ImportError, ValueError):
        return False


def plugin_refusal(environ: Mapping[str, str]) -> str | None:
    """Arctic Inference registers a vLLM plugin that is inert unless ARCTIC_INFERENCE_ENABLED=1; switched on it
    patches vLLM (for another vLLM version, CUDA only) in every engine process. Refused before start-up."""
    if environ.get(PLUGIN_SWITCH, "0") != "1":
        return None
    return (f"{PLUGIN_SWITCH}=1 switches on Arctic Inference's vLLM plugin, which patches vLLM for another version "
            f"(CUDA only); this server uses only its suffix trees (option.speculative_method=suffix): unset {PLUGIN_SWITCH}")
