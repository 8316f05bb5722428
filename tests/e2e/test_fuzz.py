"""Fuzzing every route from the server's own OpenAPI document (schemathesis), against the real
server: no 5xx, no hang, and the server still healthy afterwards.

The server runs with a short context (option.max_model_len=128) so that a generated request
asking for many tokens ends quickly, LoRA on (the adapter routes are live), and the example
adapters registered. Each operation gets a bounded number of examples.
"""

from __future__ import annotations

import shutil

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from tests.e2e.conftest import BASE_PROPS
from tests.support.server import REPO, running_server

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 12
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(REPO / "adapters", model_dir / "adapters")
    props = {
        **BASE_PROPS,
        "option.max_model_len": "128",
        "option.enable_lora": "true",
        "option.max_loras": "2",
        "option.max_lora_rank": "8",
        "option.max_rolling_batch_size": "16",
    }
    with running_server(model_dir, props) as proc:
        yield proc


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.base_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_route_answers_5xx(case, fuzz_server):
    response = case.call(timeout=REQUEST_TIMEOUT_S)
    case.validate_response(response, checks=[not_a_server_error])


def test_server_is_healthy_after_fuzzing(fuzz_server):
    assert httpx.get(fuzz_server.base_url + "/ping", timeout=10).status_code == 200
    r = httpx.post(
        fuzz_server.base_url + "/v1/completions",
        json={"model": "lmi-demo", "prompt": "def f():", "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert "Traceback" not in fuzz_server.log_path.read_text(errors="replace")
