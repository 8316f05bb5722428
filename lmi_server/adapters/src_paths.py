"""Where an adapter's `src` may point: a local directory inside an allowed root (after symlinks
are resolved, for the directory and every file read from it), or an s3:// URL downloaded once;
and whether the code that arrives with a downloaded adapter may run (`refuse_remote_code`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from lmi_server.adapters.errors import AdapterUnavailable
from lmi_server.adapters.validation import CONFIG_FILE, FORMATTER_FILE, WEIGHTS_FILES, AdapterInvalid
from lmi_server.sagemaker_env import on_sagemaker
from lmi_server.source_ref import is_remote

log = logging.getLogger(__name__)

TRUST_OPTION = "option.trust_remote_code"
SAGEMAKER_ROOT = Path("/opt/ml")
ROOTS_VARIABLE = "LMI_SAGEMAKER_ADAPTER_ROOTS"


def sagemaker_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """On SageMaker, the roots an adapter component's `src` may lie in, beside the model's own
    adapter root: /opt/ml, the tree SageMaker provisions for model data (where it places an
    adapter component's unpacked ArtifactUrl is not documented: docs/sagemaker-adapters.md), or
    the directories `LMI_SAGEMAKER_ADAPTER_ROOTS` lists (os.pathsep-separated) instead. Elsewhere
    none: a `src` outside option.adapters_path stays refused. Downloads (s3:// adapters) land in
    the download cache, on /tmp there (`sagemaker_caches`), outside these roots: a downloaded
    adapter's model.py is imported only through `refuse_remote_code`'s switch."""
    env = os.environ if env is None else env
    if not on_sagemaker(env):
        return []
    listed = [Path(p) for p in env.get(ROOTS_VARIABLE, "").split(os.pathsep) if p.strip()]
    return [p for p in listed if p.is_absolute()] or [SAGEMAKER_ROOT]


def resolve_src(src: str, allowed_roots: list[Path]) -> Path:
    """A local directory inside an allowed root (symlinks resolved), else AdapterInvalid."""
    if not isinstance(src, str) or not src.strip():
        raise AdapterInvalid("src must be a local directory path")
    if is_remote(src):
        return fetch_remote(src)
    if "://" in src:
        raise AdapterInvalid(f"src {src!r}: only local directories and s3:// URLs are accepted")
    if not allowed_roots:
        raise AdapterInvalid("no adapter root is configured (option.adapters_path); cannot register from src")
    path = Path(src).expanduser()
    if not path.is_absolute():
        path = allowed_roots[0] / path
    return confine(path, src, allowed_roots)


def inside(allowed_roots: list[Path], real: Path) -> bool:
    return any(real == root or real.is_relative_to(root) for root in allowed_roots)


def confine(path: Path, shown: str, allowed_roots: list[Path]) -> Path:
    """The resolved directory, when it and the files read from it (config, weights, model.py)
    lie inside an allowed root after symlinks are resolved; else AdapterInvalid. Used by
    `POST /adapters` and by `discover()` alike."""
    roots = ", ".join(str(r) for r in allowed_roots) or "none configured"
    try:
        real = path.resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
        raise AdapterInvalid(f"src {shown!r} is not a usable path: {exc}") from None
    if not inside(allowed_roots, real):
        raise AdapterInvalid(f"src {shown!r} is outside the allowed adapter root ({roots})")
    if not real.is_dir():
        raise AdapterInvalid(f"src {shown!r} is not a directory")
    for fname in (CONFIG_FILE, *WEIGHTS_FILES, FORMATTER_FILE):
        target = real / fname
        if target.exists() and not inside(allowed_roots, target.resolve()):
            raise AdapterInvalid(f"src {shown!r}: {fname} links outside the allowed adapter root ({roots})")
    return real


def fetch_remote(src: str) -> Path:
    """An s3:// adapter, downloaded once into the server's cache (the adapter root confines local
    paths only): a malformed URL is AdapterInvalid (400), a failed download AdapterUnavailable (424)."""
    from lmi_server.model_source import ModelSourceError, SourceInvalid, fetch

    try:
        return fetch(src)
    except SourceInvalid as exc:
        raise AdapterInvalid(f"src {src!r}: {exc.cause}") from None
    except ModelSourceError as exc:
        raise AdapterUnavailable(f"src {src!r} cannot be downloaded: {exc.cause}") from None


def refuse_remote_code(name: str, src: str, path: Path, *, trusted: bool) -> None:
    """An adapter downloaded from a remote `src` (what `resolve_src` fetches: s3://) that carries a
    `model.py` is refused (AdapterInvalid, a 400; nothing is registered, nothing imported) unless
    `option.trust_remote_code` is true.

    One switch for code that arrives with the model or an adapter from elsewhere: the key LMI and
    vLLM already read for the model's own Python files, and Hugging Face's rule for the same risk
    (code from a repository runs only when the caller says it trusts it). The adapter API is open
    unless API keys are set, so without this anyone who can reach the port could make the server
    import a script of their choosing.

    Refused rather than registered without its formatter: the formatter is part of what the
    adapter answers (its request shape, its output), so serving its weights alone would answer
    its clients differently from what its author wrote, and a note in the registration response
    reaches only the one who registered it. The 400 says which option would import the script and
    that registering the adapter without `model.py` serves its weights alone. Local directories
    (the model's adapters root, option.adapters_path, start-up discovery) are not remote: their
    `model.py` is imported as always (whoever can write there can already change the server)."""
    if trusted or not is_remote(src) or not (path / FORMATTER_FILE).is_file():
        return
    message = (
        f"adapter {name!r}: {src} carries {FORMATTER_FILE}, code from a remote source, which is imported only "
        f"with {TRUST_OPTION}=true; set it to run the adapter's formatters, or register the adapter without "
        f"{FORMATTER_FILE} to serve its weights alone (nothing was registered)"
    )
    log.warning("adapters: %s", message)
    raise AdapterInvalid(message)
