"""Valid requests in every combination the APIs accept, 1, 2, 4 and 8 at a time, against the
session's shared server (tools and LoRA on, the example adapters): two configurations fuzzed at
once, each by its own process (the base model alone; adapters and the base model mixed), so the
server also sees both configurations' batches side by side. No engine death, no 5xx, no hang,
each answer from the model or adapter it named. Seeded (LMI_FUZZ_SEED) and bounded
(LMI_FUZZ_SECONDS per configuration, the two running together); `make fuzz` runs it long over
every shipped configuration, one at a time (scripts/fuzz_valid.py). Runs after every other module
(tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.support.fuzz_runner import fuzz_figures
from tests.support.valid_fuzz import Target

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("LMI_FUZZ_SECONDS", "75"))
SEED = int(os.environ.get("LMI_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def figures(server, lora):
    """Both configurations' figures, fuzzed at the same time (one process each: hypothesis runs
    one test per process), keyed by configuration."""
    targets = [
        Target("base", server.base_url, "lmi-demo", tools=True),
        Target("lora", lora.base_url, "lmi-demo", adapters=("hello-printer", "shouter"), upper_case_adapters=("shouter",)),
    ]
    with ProcessPoolExecutor(len(targets), mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = [pool.submit(fuzz_figures, t, SECONDS, seed=SEED, shrink_seconds=min(300.0, SECONDS * 2)) for t in targets]
        return {t.name: run.result() for t, run in zip(targets, runs)}


def _check(figures: dict) -> None:
    print(json.dumps({k: v for k, v in figures.items() if k not in ("failures", "smallest_failure", "combinations")}))
    assert not figures["failed"], json.dumps(figures, indent=1)[:20000]
    assert figures["batches"] >= 3 and figures["combinations_tried"] >= 3  # it did try things


def test_valid_requests_concurrently_on_the_base_model(figures):
    _check(figures["base"])


def test_valid_requests_concurrently_with_adapters_and_the_base_model_mixed(figures):
    _check(figures["lora"])
