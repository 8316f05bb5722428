"""The registry's per-adapter series: loads, evictions and residency by adapter, within the label bound."""

from __future__ import annotations

from prometheus_client import REGISTRY

from lmi_server import metric_labels
from lmi_server.adapters.registry import AdapterRegistry
from tests.unit.adapters.conftest import make_adapter


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_loads_evictions_and_residency_by_adapter(tmp_path, base_info, fake_backend):
    bound = metric_labels.adapter_label
    saved = (bound.limit, bound.seen())
    bound.reset(2)
    try:
        root = tmp_path / "ad"
        for n in ("m1", "m2", "m3"):
            make_adapter(root, n)
        reg = AdapterRegistry(fake_backend, root=root, max_rank=8, capacity=2, base=base_info)
        reg.discover()
        loads0 = value("lmi_adapter_loads_total", adapter="m1")
        evictions0 = value("lmi_adapter_evictions_total", adapter="m1")
        other0 = value("lmi_adapter_loads_total", adapter="other")
        for n in ("m1", "m2", "m3"):  # m3 evicts m1; m3 is past the bound of 2: "other"
            await (await reg.acquire(n)).release()
        assert value("lmi_adapter_loads_total", adapter="m1") - loads0 == 1
        assert value("lmi_adapter_evictions_total", adapter="m1") - evictions0 == 1
        assert value("lmi_adapter_loads_total", adapter="other") - other0 == 1
        assert value("lmi_adapter_resident", adapter="m1") == 0
        assert value("lmi_adapter_resident", adapter="m2") == 1
        assert value("lmi_adapter_resident", adapter="other") == 1
        reg.engine_replaced(fake_backend)
        assert value("lmi_adapter_resident", adapter="m2") == 0 and value("lmi_adapter_resident", adapter="other") == 0
    finally:
        bound.reset(saved[0])
        bound._seen.extend(saved[1])
