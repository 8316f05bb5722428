"""An adapter registered with `src` = s3://...: downloaded once into the server's cache, then
validated like a local one; a failed download is a 424 naming the URL, a malformed URL a 400."""

from __future__ import annotations

import pytest

from lmi_server import model_source as ms
from lmi_server.adapters.registry import AdapterRegistry, AdapterUnavailable
from lmi_server.adapters.validation import AdapterInvalid
from tests.support.s3 import moto_s3, s3_env, upload_dir  # noqa: F401 - fixtures
from tests.unit.adapters.conftest import make_adapter

pytestmark = pytest.mark.timeout(120)


async def test_an_adapter_from_s3_is_downloaded_and_registered(s3_env, tmp_path, base_info, fake_backend):
    make_adapter(tmp_path / "src", "pirate")
    upload_dir(s3_env, "adapters", "tenants/pirate", tmp_path / "src" / "pirate")
    root = tmp_path / "adapters-root"
    root.mkdir()
    reg = AdapterRegistry(fake_backend, root=root, max_rank=8, capacity=2, base=base_info)
    entry = await reg.add("pirate", "s3://adapters/tenants/pirate")
    assert entry.spec.path == ms.local_dir("s3://adapters/tenants/pirate")
    assert entry.resident and fake_backend.loads == ["pirate"]
    # The same src again (another name) reuses the download.
    await reg.add("pirate2", "s3://adapters/tenants/pirate/", preload=False)
    assert reg.get("pirate2").spec.path == entry.spec.path


async def test_a_failed_download_is_a_failed_dependency(s3_env, tmp_path, base_info, fake_backend):
    from lmi_server.api.errors import from_adapter_error

    reg = AdapterRegistry(fake_backend, root=tmp_path, max_rank=8, capacity=2, base=base_info)
    with pytest.raises(AdapterUnavailable) as err:
        await reg.add("x", "s3://no-such-bucket/x")
    assert "s3://no-such-bucket/x" in str(err.value) and "does not exist" in str(err.value)
    assert from_adapter_error(err.value).status == 424
    with pytest.raises(AdapterInvalid) as bad:
        await reg.add("x", "s3://x/../y")
    assert from_adapter_error(bad.value).status == 400
    assert "x" not in reg.adapters and not fake_backend.loads
