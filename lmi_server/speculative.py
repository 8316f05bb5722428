"""Speculative decoding: build vLLM's `speculative_config` from the options and check it early.

Users either give vLLM's JSON (`option.speculative_config`) or the convenience keys
(`option.speculative_method`, `option.speculative_draft_model`, `option.num_speculative_tokens`).
Either way the draft is checked before the engine starts (directory, hidden size, vocabulary,
method against the target's architecture), so a mistake is a start-up error that says what to
fix instead of a failure deep inside engine initialisation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmi_server import speculative_suffix
from lmi_server.config.schema import ServingConfig
from lmi_server.model_source import is_remote

METHODS_NEEDING_DRAFT = {"eagle", "eagle3", "draft_model"}
# Target architectures whose vLLM implementation exposes the hidden states EAGLE drafts from.
EAGLE_TARGETS = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "MiniCPMForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
    "Glm4MoeForCausalLM", "GptOssForCausalLM", "Llama4ForConditionalGeneration",
}
MAX_SPECULATIVE_TOKENS = 16
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class SpeculativeConfigError(ValueError):
    pass


def _read_config(path: Path) -> dict[str, Any] | None:
    cfg = path / "config.json"
    return json.loads(cfg.read_text()) if cfg.is_file() else None


def _resolve_draft(draft: str, model_dir: Path) -> tuple[str, Path | None]:
    """Local directory (absolute or relative to the model directory), or a hub id."""
    candidate = Path(draft).expanduser()
    for path in ([candidate] if candidate.is_absolute() else [model_dir / candidate, candidate]):
        if path.is_dir():
            return str(path.resolve()), path.resolve()
    if candidate.is_absolute() or draft.startswith(".") or not _HUB_ID.match(draft):
        raise SpeculativeConfigError(
            f"speculative draft model {draft!r}: no such directory (looked in {model_dir}); "
            "give a directory with the draft's config.json and safetensors, or a hub id"
        )
    return draft, None


DEFAULT_SPECULATIVE_TOKENS = 3
NGRAM_SPECULATIVE_TOKENS = 8
NGRAM_PROMPT_LOOKUP_MAX = 5
NGRAM_PROMPT_LOOKUP_MIN = 2
"""Prompt lookup (`option.speculative_method=ngram`) when option.num_speculative_tokens is unset, for any
model: chosen by measurement, not vLLM's defaults (benchmarks/spec_grounded.py, results/spec_grounded_grid.json:
the assistant at 1 client on grounded prompts, 4/6/8/10 draft tokens x lookup up to 3/5/7 tokens). The mean
acceptance length grows with the draft (3.8 / 4.9 / 5.5 / 6.3 tokens per step at 4 / 6 / 8 / 10 tokens) but so
does the cost of verifying it; 8 and 10 were equally fast and 8 wastes less when a draft is rejected. The
longest lookup changed nothing on these prompts; 5 accepted as much as 7 and more than 3."""
NGRAM_TOKENS_BY_BATCH: list[tuple[int, int, int]] = [(1, 8, 8), (9, 4096, 0)]
"""Prompt-lookup draft tokens by running batch size (vLLM's `num_speculative_tokens_per_batch_size`, which its
n-gram proposer honours, 0 meaning no drafting) when option.num_speculative_tokens is unset. Measured with 8
tokens at every batch size (results/spec_grounded.json, mode ngram_k8_max5_min2): on grounded prompts 2.03x /
1.70x / 1.33x the tokens/s of no speculation at 1 / 4 / 16 clients, on open chat 1.12x / 0.92x / 0.87x; so
batches above 8 draft nothing (as the assistant's EAGLE-3 schedule) and no setting is slower than none at 16."""


def requested_config(
    cfg: ServingConfig, default_draft: str | None = None, default_tokens: int = DEFAULT_SPECULATIVE_TOKENS,
    default_schedule: list[tuple[int, int, int]] | None = None,
) -> dict[str, Any] | None:
    """The speculative config the user asked for (before path resolution), or None. `default_draft` /
    `default_tokens` / `default_schedule` (draft tokens by batch size): what a built-in model's
    shipped head brings when the keys leave them out."""
    spec = cfg.speculative
    from_json = cfg.engine_args.get("speculative_config")
    convenience = any(v is not None for v in (spec.speculative_method, spec.speculative_draft_model, spec.num_speculative_tokens))
    if from_json is not None and convenience:
        raise SpeculativeConfigError(
            "option.speculative_config and option.speculative_method/speculative_draft_model/"
            "num_speculative_tokens both given; use one of the two forms"
        )
    if from_json is not None:
        if not isinstance(from_json, dict):
            raise SpeculativeConfigError('option.speculative_config must be a JSON object, e.g. {"method": "eagle", "model": "draft", "num_speculative_tokens": 3}')
        return dict(from_json)
    if not convenience:
        return None
    if spec.speculative_method is None:
        raise SpeculativeConfigError("option.speculative_method is required with option.speculative_draft_model / option.num_speculative_tokens")
    out: dict[str, Any] = {"method": spec.speculative_method, "num_speculative_tokens": spec.num_speculative_tokens or default_tokens}
    if spec.num_speculative_tokens is None and default_schedule:
        out["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in default_schedule]
    draft = spec.speculative_draft_model or (default_draft if spec.speculative_method in ("eagle", "eagle3") else None)
    if draft is not None:
        out["model"] = draft
    if spec.speculative_method == "ngram":
        if spec.num_speculative_tokens is None:  # measured defaults; an explicit count drafts it at every batch size
            out["num_speculative_tokens"] = NGRAM_SPECULATIVE_TOKENS
            out["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in NGRAM_TOKENS_BY_BATCH]
        out.setdefault("prompt_lookup_max", NGRAM_PROMPT_LOOKUP_MAX)
        out.setdefault("prompt_lookup_min", NGRAM_PROMPT_LOOKUP_MIN)
    if spec.speculative_method == "suffix":
        out.pop("num_speculative_tokens_per_batch_size", None)
        speculative_suffix.apply_defaults(out, tokens_given=spec.num_speculative_tokens is not None)
    return out


def infer_method(model: Any) -> str:
    """The method of a speculative_config that gives none, as vLLM's SpeculativeConfig infers it
    (LMI documents `{"model": ..., "num_speculative_tokens": 5}`): `ngram` by that name, EAGLE heads
    by their usual names, else a draft model (vLLM refines medusa, MLP and MTP drafts by their config)."""
    if not model:
        raise SpeculativeConfigError(
            'speculative_config needs a "method" (eagle, eagle3, ngram, mtp, draft_model, ...) or a "model"'
        )
    name = str(model).lower()
    if name in ("ngram", "[ngram]"):
        return "ngram"
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    return "draft_model"


def build_speculative_config(
    cfg: ServingConfig, target_path: str, default_draft: str | None = None,
    default_tokens: int = DEFAULT_SPECULATIVE_TOKENS, default_schedule: list[tuple[int, int, int]] | None = None,
    remote: Callable[[str], Any] | None = None,
) -> dict[str, Any] | None:
    """Validated speculative_config for vLLM (draft path resolved), or None when not asked for.
    `remote` turns an s3:// draft into its local directory (or leaves the URL when only describing)."""
    wanted = requested_config(cfg, default_draft, default_tokens, default_schedule)
    if wanted is None:
        return None
    method = wanted.get("method")
    if method is None:
        method = wanted["method"] = infer_method(wanted.get("model"))
    if method == "suffix":
        try:
            speculative_suffix.check(wanted)
        except speculative_suffix.SuffixConfigError as exc:
            raise SpeculativeConfigError(str(exc)) from None
        wanted.setdefault("num_speculative_tokens", speculative_suffix.SUFFIX_SPECULATIVE_TOKENS)
    n = wanted.get("num_speculative_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SPECULATIVE_TOKENS:
        raise SpeculativeConfigError(f"num_speculative_tokens={n!r}: expected an integer from 1 to {MAX_SPECULATIVE_TOKENS}")
    if wanted.get("num_speculative_tokens_per_batch_size") is not None:
        _check_schedule(wanted["num_speculative_tokens_per_batch_size"], n)
    target_dir = Path(target_path)
    target = _read_config(target_dir) if target_dir.is_dir() else None

    if method in METHODS_NEEDING_DRAFT:
        if not wanted.get("model"):
            raise SpeculativeConfigError(f"speculative method {method!r} needs a draft model: set option.speculative_draft_model")
        draft_ref = str(wanted["model"])
        if is_remote(draft_ref):
            if remote is None:
                raise SpeculativeConfigError(f"speculative draft model {draft_ref!r}: s3:// drafts are fetched at start-up only")
            draft_ref = str(remote(draft_ref))
        if is_remote(draft_ref):  # described, not downloaded yet: checked when the server starts
            wanted["model"], draft_dir = draft_ref, None
        else:
            wanted["model"], draft_dir = _resolve_draft(draft_ref, cfg.model_dir)
        draft = _read_config(draft_dir) if draft_dir is not None else None
        if draft_dir is not None and draft is None:
            raise SpeculativeConfigError(f"draft model {draft_dir} has no config.json")
        if target is not None and draft is not None:
            _check_draft_fits(method, target, draft, draft_dir)
    elif method == "mtp":
        if target is not None and not target.get("num_nextn_predict_layers"):
            raise SpeculativeConfigError(
                "speculative method 'mtp' needs a target with multi-token-prediction layers "
                "(num_nextn_predict_layers in config.json); this model has none — use eagle or ngram"
            )
    elif method == "ngram":
        lo, hi = wanted.get("prompt_lookup_min", 1), wanted.get("prompt_lookup_max", 1)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise SpeculativeConfigError(f"ngram needs 1 <= prompt_lookup_min ({lo}) <= prompt_lookup_max ({hi})")
    return wanted


def _check_schedule(schedule: Any, most: int) -> None:
    """Draft tokens by batch size (vLLM's `num_speculative_tokens_per_batch_size`: inclusive ranges
    `[first, last, tokens]` from batch size 1 on): vLLM's own rules, checked before the engine
    starts, and no range may draft more than num_speculative_tokens (vLLM would cut it silently)."""
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    try:
        if not isinstance(schedule, list) or any(
            not isinstance(entry, list | tuple) or len(entry) != 3 or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)
            for entry in schedule
        ):
            raise ValueError("expected a list of [first batch size, last batch size, draft tokens] integer triples")
        parsed = validate_and_normalize_dynamic_sd_schedule(schedule)
    except ValueError as exc:
        raise SpeculativeConfigError(f"num_speculative_tokens_per_batch_size={schedule!r}: {exc}") from None
    over = [entry for entry in parsed if entry[2] > most]
    if over:
        raise SpeculativeConfigError(
            f"num_speculative_tokens_per_batch_size={schedule!r}: {over} drafts more than "
            f"num_speculative_tokens={most}; raise num_speculative_tokens or lower the range's tokens"
        )


def _check_draft_fits(method: str, target: dict[str, Any], draft: dict[str, Any], draft_dir: Path | None) -> None:
    archs = set(target.get("architectures") or [])
    if method in ("eagle", "eagle3") and archs and not archs & EAGLE_TARGETS:
        raise SpeculativeConfigError(
            f"speculative method {method!r} is not supported for the target architecture {sorted(archs)}; "
            "use ngram or draft_model"
        )
    t_hidden = target.get("hidden_size")
    d_hidden = draft.get("target_hidden_size") or draft.get("hidden_size")
    if method == "eagle" and t_hidden and d_hidden and t_hidden != d_hidden:
        raise SpeculativeConfigError(
            f"draft {draft_dir}: hidden_size {d_hidden} does not fit the target's hidden_size {t_hidden}; "
            "an EAGLE head must be trained for this target"
        )
    t_vocab, d_vocab = target.get("vocab_size"), draft.get("vocab_size")
    if t_vocab and d_vocab and t_vocab != d_vocab and not draft.get("draft_vocab_size"):
        raise SpeculativeConfigError(
            f"draft {draft_dir}: vocab_size {d_vocab} differs from the target's {t_vocab}; "
            "the draft must share the target's tokenizer"
        )
