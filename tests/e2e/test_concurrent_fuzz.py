"""Valid requests in every combination the APIs accept, 1, 2, 4 and 8 at a time, against the
session's shared server (tools and LoRA on, the example adapters; the base model alone, then
adapters and the base model mixed): no engine death, no 5xx, no hang, each answer from the model
or adapter it named. Seeded (LMI_FUZZ_SEED) and bounded (LMI_FUZZ_SECONDS per configuration);
`make fuzz` runs it long over every shipped configuration (scripts/fuzz_valid.py). Runs after
every other module (tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.fuzz_runner import fuzz
from tests.support.valid_fuzz import Target

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("LMI_FUZZ_SECONDS", "75"))
SEED = int(os.environ.get("LMI_FUZZ_SEED", "0"))


def _run(target: Target) -> None:
    stats = fuzz(target, SECONDS, seed=SEED, shrink_seconds=min(300.0, SECONDS * 2))
    figures = stats.as_json()
    print(json.dumps({k: v for k, v in figures.items() if k not in ("failures", "smallest_failure")}))
    assert not stats.failed(), json.dumps(figures, indent=1)[:20000]
    assert stats.batches >= 3 and len(stats.combinations) >= 3  # it did try things


def test_valid_requests_concurrently_on_the_base_model(server):
    _run(Target("base", server.base_url, "lmi-demo", tools=True))


def test_valid_requests_concurrently_with_adapters_and_the_base_model_mixed(lora):
    _run(Target("lora", lora.base_url, "lmi-demo", adapters=("hello-printer", "shouter"), upper_case_adapters=("shouter",)))
