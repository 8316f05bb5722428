import errno
import os
from pathlib import Path

import pytest

from lmi_server.kvcache import host as host_mod
from lmi_server.kvcache.host import (
    GIB, CacheDirError, check_cache_dir, probe_disk, probe_host, read_meminfo, safetensors_bytes,
)

pytestmark = pytest.mark.unit


def test_meminfo_parse(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24683920 kB\nMemFree:        1 kB\nMemAvailable:   20677512 kB\n")
    assert read_meminfo(str(f)) == (20677512 * 1024, 24683920 * 1024)


def test_safetensors_sum_and_unknown(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 5)
    (tmp_path / "config.json").write_text("{}")
    assert safetensors_bytes(tmp_path) == 15
    assert safetensors_bytes(tmp_path / "missing") is None
    h = probe_host(model_dir=Path("Qwen/Qwen2.5-72B-Instruct"))
    assert h.model_weight_bytes is None and "hub id" in h.model_weight_source
    assert h.available_ram_bytes > 0


def test_a_sharded_models_index_states_its_weights_before_the_shards_are_there(tmp_path):
    import json

    (tmp_path / "config.json").write_text("{}")
    index = {"metadata": {"total_size": 145_412_407_296}, "weight_map": {"lm_head.weight": "model-00037-of-00037.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert safetensors_bytes(tmp_path) == 145_412_407_296
    (tmp_path / "model-00001-of-00037.safetensors").write_bytes(b"x" * 10)  # one shard downloaded
    assert safetensors_bytes(tmp_path) == 145_412_407_296
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')  # no total: the files
    assert safetensors_bytes(tmp_path) == 10


def test_probe_disk_of_a_future_directory(tmp_path):
    d = probe_disk(tmp_path / "not" / "yet")
    assert d.free_bytes > 0 and d.block_size >= 512


def test_cache_dir_is_created_and_too_little_space_warns(tmp_path):
    c = check_cache_dir(tmp_path / "kv", want_odirect=False, wanted_bytes=10**18)
    assert (tmp_path / "kv").is_dir()
    assert any("the cache will fill the disk" in w for w in c.warnings)


def test_cache_dir_uncreatable(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CacheDirError, match="exists and is not a directory"):
        check_cache_dir(tmp_path / "f", want_odirect=False)
    with pytest.raises(CacheDirError, match="cannot create"):
        check_cache_dir(tmp_path / "f" / "sub", want_odirect=False)


def test_cache_dir_read_only_or_full(tmp_path, monkeypatch):
    real_write = Path.write_bytes

    def fail(code):
        def write_bytes(self, data):
            if self.name.startswith(".lmi-write-probe"):
                raise OSError(code, os.strerror(code))
            return real_write(self, data)
        return write_bytes

    monkeypatch.setattr(Path, "write_bytes", fail(errno.EROFS))
    with pytest.raises(CacheDirError, match="cannot write"):
        check_cache_dir(tmp_path, want_odirect=False)
    monkeypatch.setattr(Path, "write_bytes", fail(errno.ENOSPC))
    with pytest.raises(CacheDirError, match="is full"):
        check_cache_dir(tmp_path, want_odirect=False)


def test_not_writable_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(host_mod.os, "access", lambda *a: False)
    with pytest.raises(CacheDirError, match="not writable"):
        check_cache_dir(tmp_path, want_odirect=False)


def test_gib_constant():
    assert GIB == 1 << 30
