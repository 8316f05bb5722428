"""Checks on an adapter directory that need no engine: name, files, config, tensor shapes.

Everything here reads only JSON and safetensors *headers* (8-byte length + JSON), never tensor
data, so registering a hundred adapters stays far under a second. Adapters saved by PEFT with
`safe_serialization=False` (`adapter_model.bin`, a PyTorch pickle; vLLM's loader reads it and
`adapter_model.pt` too)
are opened with `torch.load(weights_only=True)` memory-mapped: plain tensors only, so a pickle that
would run code is refused, not executed. Every failure is an `AdapterInvalid` whose message says
what is wrong and what was expected (the API answers 400).
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_WEIGHTS_FILE = "adapter_model.bin"
# In the order vLLM's LoRA loader (vllm/lora/lora_model.py) looks for them: safetensors first,
# then the PyTorch pickles (PEFT's `safe_serialization=False` writes .bin).
WEIGHTS_FILES = (WEIGHTS_FILE, PICKLE_WEIGHTS_FILE, "adapter_model.pt")
FORMATTER_FILE = "model.py"

NAME_MAX = 256
NAME_RULE = (
    f"1-{NAME_MAX} printable characters, no '/' or '\\', not '.' or '..', no space at either end"
)

# vLLM's LoRA prefix in PEFT files: base_model.model.<module path>.lora_{A,B}[.default].weight
_KEY_RE = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")
_EMBED_KEY_RE = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_embedding_(?P<ab>[AB])$")
_HEADER_LIMIT = 100 * 1024 * 1024


class AdapterInvalid(ValueError):
    """An adapter that cannot be registered; the message names the reason."""


def validate_name(name: Any) -> str:
    """LMI's rule is any name; SageMaker's own identifiers are not documented. So any printable
    name is taken, within what keeps it safe: it is one path segment of the adapter API (no '/'
    or '\\', not '.' or '..'), a model id and a log field (printable, no space at either end,
    bounded). It is never a file path (files are found from `src`; start-up discovery names an
    adapter after its directory) and a Prometheus label value only through `metric_labels`."""
    if not isinstance(name, str) or not name:
        raise AdapterInvalid(f"adapter name must be a non-empty string ({NAME_RULE})")
    if (
        len(name) > NAME_MAX or not name.isprintable() or "/" in name or "\\" in name
        or name in (".", "..") or name != name.strip()
    ):
        raise AdapterInvalid(f"invalid adapter name {name[:NAME_MAX]!r}: {NAME_RULE}")
    return name


def weights_file(path: Path) -> Path | None:
    """The adapter's weight file: adapter_model.safetensors, else adapter_model.bin; None if neither."""
    for fname in WEIGHTS_FILES:
        if (path / fname).is_file():
            return path / fname
    return None


def has_adapter_files(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and weights_file(path) is not None


def read_pickle_header(path: Path) -> dict[str, Any]:
    """Tensor name -> {"shape", "data_offsets"} of a PyTorch `adapter_model.bin` (or .pt), shaped like a
    safetensors header. Loaded with `weights_only=True` (no code runs; anything but tensors and
    plain containers is refused) and memory-mapped when the file is in torch's zip format, so the
    tensor data is not read."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch comes with vLLM
        raise AdapterInvalid(f"{path.name} is a PyTorch file and torch is not installed; save the adapter as safetensors") from None
    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        # torch's message suggests weights_only=False; keep only the line that names what was found.
        found = next((ln.strip().rstrip(".") for ln in str(exc).splitlines() if "unsupported" in ln.lower()), "")
        raise AdapterInvalid(
            f"{path.name} holds more than plain tensors and was refused (read with torch.load(weights_only=True))"
            + (f": {found}" if found else "")
            + "; save the adapter with safe_serialization=True (adapter_model.safetensors)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated zip, not a torch file, ...
        raise AdapterInvalid(f"{path.name} is corrupt or not a PyTorch file: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise AdapterInvalid(f"{path.name} must hold a dict of tensors (a state dict), got {type(state).__name__}")
    header: dict[str, Any] = {}
    offset = 0
    for key, tensor in state.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise AdapterInvalid(f"{path.name} must hold a dict of tensors; entry {key!r} is {type(tensor).__name__}")
        size = tensor.numel() * tensor.element_size()
        header[key] = {"shape": [int(d) for d in tensor.shape], "data_offsets": [offset, offset + size]}
        offset += size
    return header


def read_weights_header(path: Path) -> dict[str, Any]:
    """The tensor table of an adapter weight file, safetensors or PyTorch pickle."""
    if path.name != WEIGHTS_FILE:
        return read_pickle_header(path)
    return read_safetensors_header(path)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor name -> dtype/shape/offsets)."""
    try:
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise AdapterInvalid(f"{path.name} is not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", raw_len)
            if length <= 1 or length > _HEADER_LIMIT:
                raise AdapterInvalid(f"{path.name} is corrupt: header length {length} is implausible")
            data = fh.read(length)
            fh.seek(0, 2)
            size = fh.tell()
    except OSError as exc:
        raise AdapterInvalid(f"cannot read {path.name}: {exc.strerror or exc}") from None
    if len(data) != length:
        raise AdapterInvalid(f"{path.name} is corrupt: truncated header")
    try:
        header = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterInvalid(f"{path.name} is corrupt: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise AdapterInvalid(f"{path.name} is corrupt: header is not a JSON object")
    header.pop("__metadata__", None)
    end = 8 + length
    for key, info in header.items():
        try:
            start, stop = info["data_offsets"]
            info["shape"] = [int(d) for d in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise AdapterInvalid(f"{path.name} is corrupt: bad entry for tensor {key!r}") from None
        if end + stop > size or start > stop:
            raise AdapterInvalid(f"{path.name} is corrupt: tensor {key!r} lies beyond the end of the file (truncated?)")
    return header


@dataclass(frozen=True)
class BaseModelInfo:
    """What adapters are checked against: names, weight shapes, module names."""

    names: frozenset[str]  # served names, model path, directory name, config _name_or_path
    shapes: dict[str, tuple[int, ...]]  # base weight name (without .weight) -> shape
    module_names: frozenset[str]  # last path component of every linear/embedding weight

    @classmethod
    def empty(cls, names: list[str] | None = None) -> BaseModelInfo:
        return cls(frozenset(names or []), {}, frozenset())


@lru_cache(maxsize=4)
def _model_headers(model_path: str) -> dict[str, tuple[int, ...]]:
    root = Path(model_path)
    files: list[Path] = []
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({root / f for f in weight_map.values()})
    elif (root / "model.safetensors").is_file():
        files = [root / "model.safetensors"]
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        for key, info in read_safetensors_header(f).items():
            if key.endswith(".weight"):
                shapes[key[: -len(".weight")]] = tuple(info["shape"])
    return shapes


def base_model_info(model_path: str | None, served_names: list[str]) -> BaseModelInfo:
    names = set(served_names)
    shapes: dict[str, tuple[int, ...]] = {}
    if model_path:
        p = Path(model_path)
        names |= {str(p), p.name}
        if p.is_dir():
            with_path = p.resolve()
            names |= {str(with_path), with_path.name}
            try:
                cfg = json.loads((p / "config.json").read_text())
                if cfg.get("_name_or_path"):
                    names.add(str(cfg["_name_or_path"]))
            except (OSError, json.JSONDecodeError):
                pass
            try:
                shapes = _model_headers(str(with_path))
            except AdapterInvalid:
                shapes = {}
    modules = frozenset(k.rsplit(".", 1)[-1] for k in shapes)
    return BaseModelInfo(frozenset(n for n in names if n), shapes, modules)


@dataclass
class AdapterSpec:
    """What registration learned about an adapter directory (no weights loaded)."""

    name: str
    path: Path
    rank: int
    alpha: float
    target_modules: list[str]
    base_model: str | None
    has_formatter: bool
    weight_bytes: int
    weights_file: str = WEIGHTS_FILE
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    warnings: list[str] = field(default_factory=list)


def _target_modules(cfg: dict[str, Any]) -> list[str]:
    tm = cfg.get("target_modules")
    if isinstance(tm, str):
        # PEFT allows a regex string; take the module names it mentions.
        return sorted(set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*_proj|lm_head|embed_tokens", tm))) or [tm]
    if isinstance(tm, list) and all(isinstance(t, str) for t in tm):
        return list(tm)
    raise AdapterInvalid(f"{CONFIG_FILE}: target_modules must be a list of module names, got {tm!r}")


def _read_config(name: str, path: Path, max_rank: int | None) -> tuple[dict[str, Any], int]:
    """adapter_config.json as a LoRA config whose rank vLLM can serve: (config, rank)."""
    try:
        cfg = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterInvalid(f"adapter {name!r}: {CONFIG_FILE} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise AdapterInvalid(f"adapter {name!r}: {CONFIG_FILE} must hold a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterInvalid(f"adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not supported (only LORA)")
    rank = cfg.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterInvalid(f"adapter {name!r}: {CONFIG_FILE} needs a positive integer rank \"r\", got {rank!r}")
    if max_rank is not None and rank > max_rank:
        raise AdapterInvalid(
            f"adapter {name!r}: rank r={rank} exceeds option.max_lora_rank={max_rank}; "
            "raise option.max_lora_rank or use an adapter of lower rank"
        )
    return cfg, rank


def _check_base(name: str, base_name: Any, targets: list[str], base: BaseModelInfo | None) -> list[str]:
    """Target modules the base model lacks are refused; another base model's name is only a warning."""
    warnings: list[str] = []
    if base is not None and base_name and base.names and str(base_name) not in base.names:
        if Path(str(base_name)).name not in base.names:
            # A name says where the base came from (a hub id, a training machine's path), not what
            # it is: the same model served from /opt/ml/model has another name. The tensors decide.
            served = sorted(n for n in base.names if "/" not in n) or sorted(base.names)
            check = "its tensors match the served model's shapes" if base.shapes else "the served model's shapes are unknown here"
            warnings.append(
                f"adapter {name!r} names base model {base_name!r}, this server serves {served}; "
                f"accepted because {check}"
            )
    if base is not None and base.module_names:
        missing = [t for t in targets if t not in base.module_names]
        if missing:
            raise AdapterInvalid(
                f"adapter {name!r}: target modules {missing} do not exist in the base model "
                f"(it has {sorted(m for m in base.module_names if m != 'weight')})"
            )
    return warnings


def _check_tensors(name: str, weights: Path, rank: int, base: BaseModelInfo | None) -> int:
    """Every LoRA tensor's shape against the base model's module (when its shapes are known); returns
    the weights' size in bytes."""
    lora_keys = 0
    weight_bytes = 0
    for key, info in read_weights_header(weights).items():
        weight_bytes += info["data_offsets"][1] - info["data_offsets"][0]
        m = _KEY_RE.match(key) or _EMBED_KEY_RE.match(key)
        if not m:
            continue
        lora_keys += 1
        if base is None or not base.shapes:
            continue
        module = m.group("module")
        base_shape = base.shapes.get(module)
        if base_shape is None:
            raise AdapterInvalid(
                f"adapter {name!r}: tensor {key!r} targets module {module!r}, which the base model does not have"
            )
        shape = tuple(info["shape"])
        if len(base_shape) == 2 and len(shape) == 2 and _KEY_RE.match(key):
            out_dim, in_dim = base_shape
            want = (shape[0], in_dim) if m.group("ab") == "A" else (out_dim, shape[1])
            if shape != want or (m.group("ab") == "A" and shape[0] != rank) or (m.group("ab") == "B" and shape[1] != rank):
                raise AdapterInvalid(
                    f"adapter {name!r}: tensor {key!r} has shape {list(shape)}, but the base model's "
                    f"{module} is {list(base_shape)} and r={rank} (wrong base model?)"
                )
    if lora_keys == 0:
        raise AdapterInvalid(
            f"adapter {name!r}: {weights.name} holds no LoRA tensors (expected keys like "
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)"
        )
    return weight_bytes


def inspect_adapter(
    name: str,
    path: Path,
    *,
    max_rank: int | None = None,
    base: BaseModelInfo | None = None,
) -> AdapterSpec:
    """Validate an adapter directory against the served model; raise AdapterInvalid with the reason."""
    validate_name(name)
    if not path.is_dir():
        raise AdapterInvalid(f"adapter directory {path} does not exist")
    if not (path / CONFIG_FILE).is_file():
        raise AdapterInvalid(f"adapter {name!r}: {CONFIG_FILE} is missing in {path}")
    weights = weights_file(path)
    if weights is None:
        raise AdapterInvalid(f"adapter {name!r}: {WEIGHTS_FILE} is missing in {path} ({' or '.join(WEIGHTS_FILES[1:])} is accepted too)")
    cfg, rank = _read_config(name, path, max_rank)
    targets = _target_modules(cfg)
    base_name = cfg.get("base_model_name_or_path")
    warnings = _check_base(name, base_name, targets, base)
    weight_bytes = _check_tensors(name, weights, rank, base)
    for warning in warnings:
        log.warning("adapters: %s", warning)
    return AdapterSpec(
        name=name,
        path=path,
        rank=rank,
        alpha=float(cfg.get("lora_alpha", rank)),
        target_modules=targets,
        base_model=str(base_name) if base_name else None,
        has_formatter=(path / FORMATTER_FILE).is_file(),
        weight_bytes=weight_bytes,
        weights_file=weights.name,
        config=cfg,
        warnings=warnings,
    )

