"""A hub model's revision (a branch, a tag, or a commit) resolved to the commit it names now.

A branch moves: `main` today and `main` after a push are other weights under one name. The engine
resolves the revision once as it starts (vLLM's `resolve_revision`: huggingface_hub's
`HfApi.resolve_revision`, the commit whose snapshot folder the files land in); the server asks the
same question, the same way, before it names the KV keys, and pins the engine to the answer
(`runtime/kv_plan.py`), so that the keys name exactly the weights that are loaded.

- A revision that is already a full commit hash is that commit; nothing is contacted.
- When serving, the hub is asked (one request; offline mode, HF_HUB_OFFLINE, asks nothing); when it
  cannot be reached, or when only describing (`lmi-server config`), the commit the local Hugging
  Face cache holds for that revision (`refs/<revision>`, written by the last download), if any.
- With VLLM_USE_MODELSCOPE the engine resolves nothing on the Hugging Face hub: neither does this.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger(__name__)

COMMIT = re.compile(r"[0-9a-f]{40}")


def uses_modelscope() -> bool:
    """Whether the engine fetches hub ids from ModelScope (vLLM's VLLM_USE_MODELSCOPE)."""
    return os.environ.get("VLLM_USE_MODELSCOPE", "").strip().lower() in ("1", "true")


def hub_commit(repo_id: str, revision: str | None, *, contact_hub: bool, token: str | None = None) -> str | None:
    """The commit `revision` (default: the default branch) of hub model `repo_id` names: asked of
    the hub when `contact_hub` (serving) and not offline, else (or when the hub cannot be reached)
    read from the local cache; None when neither can say."""
    if revision is not None and COMMIT.fullmatch(revision.strip()):
        return revision.strip()
    if uses_modelscope():
        return None
    from huggingface_hub import HfApi, constants

    try:
        resolved = HfApi().resolve_revision(
            repo_id, revision=revision or None, local_files_only=not contact_hub or constants.HF_HUB_OFFLINE,
            token=token,
        )
    except Exception as exc:  # noqa: BLE001 - not found, gated, unreachable and not cached: unresolved
        log.info("%s@%s: revision not resolved to a commit (%s)", repo_id, revision or "main", exc)
        return None
    commit = str(getattr(resolved, "resolved", "") or "")
    return commit if COMMIT.fullmatch(commit) else None
