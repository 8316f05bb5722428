"""Fuzzing every route from the server's own OpenAPI document (schemathesis), against the real
server: no 5xx, no hang, and the server still healthy afterwards.

The server runs with a short context (option.max_model_len=128) so that a generated request
asking for many tokens ends quickly, LoRA on (the adapter routes are live), and adapters
registered: the LMI user's model directory of tests/e2e/test_lmi_dropin.py (`lmi_dir`,
tests/e2e/conftest.py; its formatters and handle see the fuzzed bodies too), fuzzed after that
module. Each operation gets a bounded number of examples.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error


pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 12
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def fuzz_server(lmi_dir):
    """The session's LMI model-directory server (tests/e2e/conftest.py), after test_lmi_dropin.py."""
    return lmi_dir


def test_no_route_answers_5xx(fuzz_server):
    """Every operation of /openapi.json, with generated valid and invalid inputs."""
    schema = schemathesis.openapi.from_url(fuzz_server.base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /invocations", "POST /v1/chat/completions", "POST /adapters"}
    failures: dict[str, str] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            response = case.call(base_url=fuzz_server.base_url, timeout=REQUEST_TIMEOUT_S)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, report all
            failures[operation.label] = f"{type(exc).__name__}: {str(exc)[:1500]}"
    assert not failures, failures


def test_server_is_healthy_after_fuzzing(fuzz_server):
    assert httpx.get(fuzz_server.base_url + "/ping", timeout=10).status_code == 200
    r = httpx.post(
        fuzz_server.base_url + "/v1/completions",
        json={"model": "lmi-demo", "prompt": "def f():", "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert "unhandled error" not in fuzz_server.log_path.read_text(errors="replace")  # no 500 from our layer
