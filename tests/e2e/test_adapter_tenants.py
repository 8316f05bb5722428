"""LoRA adapters as tenants under a flood, against the real server: with neither an API key nor a
tenant header, the adapter names the tenant; a flood of streamed requests on one adapter queues
for engine slots while another adapter's requests are admitted ahead of the flood's queued ones,
each probe's first prefill runs in an engine step of its own (lmi_server/tenant_scheduler.py), and
the flood still gets all of its work done. Timing ratios are the benchmark's
(`benchmarks/fairness.py --tenants adapters`), not asserted here.

The session's demo server (`lora`, tests/e2e/conftest.py): LoRA on with its example adapters and
a batch of eight (option.max_num_seqs, plus the two reserved slots that fair admission adds for
other tenants), small enough for a flood of thirty to queue. It runs right after
tests/e2e/test_lora.py, which checks the adapters' state before any module loads them.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from lmi_server.tenant_scheduler import CLEARED
from tests.support.server import ServerProcess

pytestmark = pytest.mark.e2e

FLOOD, PROBE = "hello-printer", "shouter"
FLOOD_SIZE = 30


@pytest.fixture(scope="module")
def lora_server(lora):
    """The shared demo server, named for what this module needs of it: LoRA and a small batch."""
    return lora


def series(server: ServerProcess, name: str, **labels: str) -> float:
    """Sum of a /metrics series over the samples whose labels include `labels`."""
    text = httpx.get(server.base_url + "/metrics", timeout=60).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.split()[-1])
    return total


def cleared_steps(server: ServerProcess) -> int:
    """Engine steps the new-tenant scheduler held for a newcomer's first prefill (its log lines)."""
    return server.log_path.read_text(errors="replace").count(CLEARED + ":")


def stream(server: ServerProcess, adapter: str, max_tokens: int) -> dict:
    """One streamed chat request on `adapter`; its status and the tokens its usage chunk counts."""
    body = {"model": adapter, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = None
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return {"status": r.status_code, "tokens": tokens}


def test_another_adapter_is_admitted_ahead_of_a_flood_of_one_adapter(lora_server):
    for adapter in (FLOOD, PROBE):  # both adapters loaded before the flood
        assert stream(lora_server, adapter, 4)["status"] == 200
    admitted_before = series(lora_server, "lmi_tenant_requests_total", tenant=FLOOD, outcome="admitted")
    probe_waits_before = series(lora_server, "lmi_tenant_queue_wait_seconds_count", tenant=PROBE)
    quick_before = series(lora_server, "lmi_tenant_queue_wait_seconds_bucket", tenant=PROBE, le="0.1")
    cleared_before = cleared_steps(lora_server)
    flood: list[dict] = []
    threads = [threading.Thread(target=lambda: flood.append(stream(lora_server, FLOOD, 48))) for _ in range(FLOOD_SIZE)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while series(lora_server, "lmi_tenant_queue_depth", tenant=FLOOD) < 10:  # the flood queues for slots
        assert time.monotonic() < deadline, "the flood never queued"
        time.sleep(0.2)
    queued_behind = []
    for _ in range(3):
        probe = stream(lora_server, PROBE, 8)
        assert probe == {"status": 200, "tokens": 8}
        # the probe is answered while the flood, sent before it, still has requests waiting
        queued_behind.append(series(lora_server, "lmi_tenant_queue_depth", tenant=FLOOD))
    for t in threads:
        t.join(600)
    assert all(q > 0 for q in queued_behind), queued_behind
    # each probe's first prefill had an engine step of its own, the flood's decodes held one step
    assert cleared_steps(lora_server) - cleared_before >= 3
    # admitted at once (in a slot kept for other tenants), not after the flood's queued requests
    waits = series(lora_server, "lmi_tenant_queue_wait_seconds_count", tenant=PROBE) - probe_waits_before
    quick = series(lora_server, "lmi_tenant_queue_wait_seconds_bucket", tenant=PROBE, le="0.1")
    assert waits == 3
    assert quick - quick_before == 3  # every probe waited under 0.1 s
    # the flood got all of its work done, no 5xx, each stream complete
    assert sorted(r["status"] for r in flood) == [200] * FLOOD_SIZE
    assert all(r["tokens"] == 48 for r in flood)
    assert series(lora_server, "lmi_tenant_requests_total", tenant=FLOOD, outcome="admitted") - admitted_before == FLOOD_SIZE
