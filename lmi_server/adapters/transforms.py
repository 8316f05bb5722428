"""The KV-isolation salt of the adapter path (pure, no HTTP)."""

from __future__ import annotations

import hashlib


def isolated_cache_salt(identity: str | None, client_salt: str | None) -> str | None:
    """The `cache_salt` vLLM and LMCache key reused KV by (LMCache keys chunks by token ids and
    salt only). KV computed under an adapter carries its identity (name + weight fingerprint),
    so only requests through the same adapter with the same weights reuse it; base requests
    without a salt stay unsalted. A client's own salt is folded in (never passed through as is,
    so no client can pick another namespace's salt)."""
    if identity is None and not client_salt:
        return None
    digest = hashlib.sha256()
    digest.update((identity or "base").encode())
    digest.update(b"\0")
    digest.update((client_salt or "").encode())
    return digest.hexdigest()
