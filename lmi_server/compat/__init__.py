"""The one place where lmi_server touches names that vLLM and LMCache do not offer as API.

Why: each such use (a patched module function, a private method called, an attribute of an
internal object written) breaks silently when the upstream moves it. Keeping them here, one module
per upstream (`compat.vllm`, `compat.lmcache`), gives each a named function for the rest of the
code and a row in `USES` (`contract.Use`): what we rely on, checked against the installed packages
by tests/unit/compat and by `make upgrade-check VLLM=<version>` (docs/upgrading.md).
Nothing here imports vLLM or LMCache at module import: each function imports what it touches.
"""

from __future__ import annotations

from lmi_server.compat import lmcache, vllm
from lmi_server.compat.contract import Use

USES: tuple[Use, ...] = vllm.USES + lmcache.USES
"""Every private upstream name the seam uses, vLLM's then LMCache's."""
INTERNAL: tuple[Use, ...] = vllm.INTERNAL + lmcache.INTERNAL
"""Public-named entry points of upstream internal modules, called in place by their callers."""
CONTRACT: tuple[Use, ...] = USES + INTERNAL
"""Every row the contract tests and `make upgrade-check` check."""

__all__ = ["CONTRACT", "INTERNAL", "USES", "Use", "lmcache", "vllm"]
