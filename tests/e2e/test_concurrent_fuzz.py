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
MIN_BATCHES = int(os.environ.get("LMI_FUZZ_MIN_BATCHES", "12"))
"""Batches each configuration must have run (past the time budget if need be) for its verdict."""
ROUTES = {"/invocations", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"}
SEED = int(os.environ.get("LMI_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def figures(server, lora):
    """Both configurations' figures, fuzzed at the same time (one process each: hypothesis runs
    one test per process), keyed by configuration."""
    targets = [
        Target("base", server.base_url, "lmi-demo", tools=True),
        # three adapters in use on max_loras=2, the fair scheduler on (the default)
        Target("lora", lora.base_url, "lmi-demo", adapters=("hello-printer", "shouter", "hello-copy"),
               upper_case_adapters=("shouter",)),
    ]
    with ProcessPoolExecutor(len(targets), mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = [pool.submit(fuzz_figures, t, SECONDS, seed=SEED, shrink_seconds=min(300.0, SECONDS * 2),
                            min_batches=MIN_BATCHES, routes=frozenset(ROUTES)) for t in targets]
        return {t.name: run.result() for t, run in zip(targets, runs)}


def _check(figures: dict) -> None:
    print(json.dumps({k: v for k, v in figures.items() if k not in ("failures", "smallest_failure", "reproducer",
                                                                     "reproducer_script")}))
    if figures["reproducer_script"]:
        print("smallest failing batch (BASE = the server's URL):\n" + figures["reproducer_script"])
    assert not figures["failed"], json.dumps(figures, indent=1)[:20000]
    assert not figures["harness_errors"] and figures["batches"] >= MIN_BATCHES
    routes = set(figures["requests_by_route"])
    assert routes >= ROUTES, f"routes never tried: {sorted(ROUTES - routes)}"


def test_valid_requests_concurrently_on_the_base_model(figures):
    _check(figures["base"])


def test_valid_requests_concurrently_with_adapters_and_the_base_model_mixed(figures):
    _check(figures["lora"])
