"""The KV-isolation salt (a pure function)."""

from __future__ import annotations

import json

from lmi_server.adapters.transforms import isolated_cache_salt


def test_cache_salt_isolates_adapters_weights_and_clients():
    assert isolated_cache_salt(None, None) is None  # base, no client salt: shared base KV
    a1 = isolated_cache_salt("lora:a:fp1", None)
    assert a1 and a1 != isolated_cache_salt("lora:a:fp2", None) != isolated_cache_salt("lora:b:fp1", None)
    assert isolated_cache_salt("lora:a:fp1", "client") not in (a1, isolated_cache_salt(None, "client"))
    # A base client cannot step into an adapter's namespace by sending its salt.
    assert isolated_cache_salt(None, a1) != a1
    assert len(a1) == 64 and all(c in "0123456789abcdef" for c in a1)
