"""On SageMaker, caches default to /tmp: the instance's large NVMe volume is mounted there.

Why: SageMaker puts an NVMe instance's instance storage at /tmp inside the container, while the
root volume (where this image keeps `/opt/lmi_server/cache` and a user's home) is small. LMI keeps
its caches on /tmp for that reason, and documents `/tmp/lmcache` with O_DIRECT as the LMCache disk
tier for SageMaker. This module gives the same layout: s3:// downloads (`download_dir`), Hugging Face's cache and
the compile caches (torch inductor, Triton, vLLM's own) default under /tmp, and the auto plan's
disk tier defaults to /tmp/lmcache (`kv_cache_dir`).
A variable the user set wins; nothing is written to the model directory (/opt/ml/model, which
SageMaker may mount read-only). Elsewhere nothing changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

from lmi_server.sagemaker_env import on_sagemaker, why

log = logging.getLogger(__name__)

NVME_ROOT = Path("/tmp")
CACHE_ENV = {
    "HF_HOME": "/tmp/.cache/huggingface",  # hub models, as LMI's images set it
    "PYTORCH_KERNEL_CACHE_PATH": "/tmp/.cache",  # as LMI's images set it
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/.cache/torchinductor",
    "TRITON_CACHE_DIR": "/tmp/.cache/triton",
    "VLLM_CACHE_ROOT": "/tmp/.cache/vllm",  # torch.compile artefacts and vLLM's other caches
}
DOWNLOAD_DIR = NVME_ROOT / "lmi_server" / "download"
"""Where s3:// models and adapters are downloaded on SageMaker (`model_source.cache_root`)."""
KV_CACHE_DIR = NVME_ROOT / "lmcache"
"""The LMCache disk tier's directory on SageMaker, LMI's path."""


def nvme_usable(root: Path | None = None) -> bool:
    root = NVME_ROOT if root is None else root
    return root.is_dir() and os.access(root, os.W_OK | os.X_OK)


def cache_environment(env: MutableMapping[str, str] | None = None, *, root: Path | None = None) -> dict[str, str]:
    """The cache variables to set: on SageMaker with a writable /tmp, each of `CACHE_ENV` the
    environment does not set yet; {} elsewhere."""
    env = os.environ if env is None else env
    if not on_sagemaker(env) or not nvme_usable(root):
        return {}
    return {key: value for key, value in CACHE_ENV.items() if not env.get(key, "").strip()}


def apply(env: MutableMapping[str, str] | None = None, *, root: Path | None = None) -> dict[str, str]:
    """Set the cache defaults in the process environment (before anything reads them: Hugging
    Face's constants are read at import); the children inherit them. Returns what was set."""
    env = os.environ if env is None else env
    chosen = cache_environment(env, root=root)
    env.update(chosen)
    if chosen:
        log.info(
            "SageMaker (%s): caches on the instance volume at %s: %s",
            why(env), NVME_ROOT if root is None else root, ", ".join(f"{k}={v}" for k, v in sorted(chosen.items())),
        )
    elif on_sagemaker(env) and not nvme_usable(root):
        log.warning("SageMaker (%s): %s is not writable; caches stay where their defaults are", why(env), NVME_ROOT)
    return chosen


def _nvme_root(env: MutableMapping[str, str] | None, root: Path | None) -> Path | None:
    """The instance volume's root on SageMaker when it is writable, else None."""
    env = os.environ if env is None else env
    root = NVME_ROOT if root is None else root
    return root if on_sagemaker(env) and nvme_usable(root) else None


def kv_cache_dir(env: MutableMapping[str, str] | None = None, *, root: Path | None = None) -> Path | None:
    """/tmp/lmcache on SageMaker when /tmp is writable (created here), else None."""
    root = _nvme_root(env, root)
    if root is None:
        return None
    path = root / KV_CACHE_DIR.name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("SageMaker: cannot create the LMCache disk tier directory %s: %s", path, exc)
        return None
    return path


def download_dir(env: MutableMapping[str, str] | None = None, *, root: Path | None = None) -> Path | None:
    """/tmp/lmi_server/download on SageMaker when /tmp is writable, else None."""
    root = _nvme_root(env, root)
    return None if root is None else root / DOWNLOAD_DIR.relative_to(NVME_ROOT)
