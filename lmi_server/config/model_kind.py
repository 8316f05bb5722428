"""What kind of model is served (generate, embed, classify), decided once, with the reason.

The HTTP layer mounts each kind's routes from this decision (`api/kinds.py`); nothing else asks
again. The decision follows vLLM's own (`vllm/config/model.py`: an explicit runner/convert wins, a
sentence-transformers `modules.json` means a pooling model, else the architecture's suffix), read
from the model directory's files without importing vLLM. A model whose files are not here before
start-up (a hub id, s3://) counts as generating unless `option.task` says otherwise; the engine's
own view is checked against this decision once it is built (`check_engine_kind`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Kind = Literal["generate", "embed", "classify"]

# vLLM 0.32's architecture suffixes -> (runner, convert), in its order (first match wins).
ARCHITECTURE_SUFFIXES: list[tuple[str, Kind]] = [
    ("ForCausalLM", "generate"),
    ("ForConditionalGeneration", "generate"),
    ("ChatModel", "generate"),
    ("LMHeadModel", "generate"),
    ("ForTextEncoding", "embed"),
    ("EmbeddingModel", "embed"),
    ("ForSequenceClassification", "classify"),
    ("ForTokenClassification", "classify"),
    ("ForAudioClassification", "classify"),
    ("ForImageClassification", "classify"),
    ("ForVideoClassification", "classify"),
    ("ClassificationModel", "classify"),
    ("ForRewardModeling", "embed"),
    ("RewardModel", "embed"),
    ("Model", "embed"),  # a bare encoder (BertModel, XLMRobertaModel, ...): vLLM pools it
]

# What each kind serves, for messages and `lmi-server config`.
SERVES: dict[str, str] = {
    "generate": "text generation: /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, "
    "/invocations (LMI, chat, completion)",
    "embed": "text embeddings: /v1/embeddings, /invocations ({\"inputs\": str | [str]} -> a list of vectors), /score, /rerank",
    "classify": "classification (vLLM's pooling runner); neither generation nor embedding routes apply",
}

TASK_HINT = "option.task=text-embedding (HF_TASK=text-embedding) for an embedding model"


class ModelKind(BaseModel):
    """The kind of model served and why it is that kind."""

    model_config = ConfigDict(frozen=True)

    name: Kind
    reason: str
    vision: bool = False
    """The model reads images too (its config.json has a vision encoder): image_url parts in chat."""

    @property
    def serves(self) -> str:
        if self.vision:
            return SERVES[self.name] + "; images in chat messages (image_url parts: data: URLs, checked by option.max_image_bytes, option.max_image_pixels, option.limit_mm_per_prompt)"
        return SERVES[self.name]

    def describe(self) -> dict[str, str]:
        return {"kind": self.name, "reason": self.reason, "serves": self.serves}


def kind_of_architecture(architecture: str) -> Kind | None:
    for suffix, kind in ARCHITECTURE_SUFFIXES:
        if architecture.endswith(suffix):
            return kind
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def decide_kind(engine_args: dict[str, Any], model_path: str | None, *, builtin: Kind | None = None) -> ModelKind:
    """The kind from (in order) vLLM's `convert`/`runner` as configured (option.task sets them),
    a built-in model's own kind, the model directory's sentence-transformers `modules.json`, its
    `config.json` architectures; else generate (what vLLM falls back to)."""
    convert = str(engine_args.get("convert") or "auto").lower()
    runner = str(engine_args.get("runner") or "auto").lower()
    if convert in ("embed", "classify"):
        return ModelKind(name=convert, reason=f"vLLM convert={convert} is configured (option.task or option.convert)")
    if runner == "generate":
        return ModelKind(name="generate", reason="vLLM runner=generate is configured (option.task or option.runner)")
    if runner == "pooling":
        return ModelKind(name="embed", reason="vLLM runner=pooling is configured; a pooling model embeds unless convert=classify")
    if builtin is not None:
        return ModelKind(name=builtin, reason=f"option.model_id names a built-in model that {builtin}s")
    directory = Path(model_path) if model_path else None
    if directory is None or not (directory / "config.json").is_file():
        return ModelKind(
            name="generate",
            reason=f"the model's files are not here before start-up, so its kind is taken as generate; set {TASK_HINT}",
        )
    if (directory / "modules.json").is_file():
        return ModelKind(name="embed", reason="the model directory is a sentence-transformers model (modules.json): vLLM pools it")
    config = _read_json(directory / "config.json")
    architectures = config.get("architectures") if isinstance(config, dict) else None
    for architecture in architectures if isinstance(architectures, list) else []:
        kind = kind_of_architecture(str(architecture))
        if kind is not None:
            vision = kind == "generate" and isinstance(config.get("vision_config"), dict)
            return ModelKind(name=kind, reason=f"config.json architecture {architecture}: vLLM's default for it"
                             + (", with a vision encoder (vision_config)" if vision else ""), vision=vision)
    return ModelKind(name="generate", reason="config.json names no architecture vLLM classifies; vLLM's fallback is generate")


class KindMismatch(RuntimeError):
    """The engine runs the model as another kind than the configuration decided."""


def check_engine_kind(kind: ModelKind, supported_tasks: tuple[str, ...] | list[str]) -> None:
    """Raise when the engine's supported tasks disagree with the decided kind (start-up fails
    with the reason, rather than serving routes that cannot work)."""
    tasks = set(supported_tasks)
    wanted = {"generate": {"generate"}, "embed": {"embed"}, "classify": {"classify"}}[kind.name]
    if tasks & wanted:
        return
    engine = "generate" if "generate" in tasks else "embed" if "embed" in tasks else ", ".join(sorted(tasks)) or "nothing"
    raise KindMismatch(
        f"the configuration decided this model {kind.name}s ({kind.reason}), but vLLM runs it for: {engine}; "
        f"set option.task to the model's task ({TASK_HINT}; text-generation for a generating model)"
    )
