"""The chart's persistent KV volume (lmcache.disk): off by default; on, a volume at /mnt/kvcache
(emptyDir, pvc or hostPath) that LMCache's disk tier uses, valid for every Kubernetes version the
chart supports, and loading with `lmi-server config` as a disk tier with its size limit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.integration.test_helm_chart import (
    KUBE_VERSIONS, REPO, find, materialize_pod, one, render_values, server_container, validate_object,
)

MOUNT = "/mnt/kvcache"


def disk(**over) -> dict:
    return {"lmcache": {"disk": {"enabled": True, **over}}}


def kv_volume(objs: list[dict]) -> dict | None:
    pod = one(objs, "Deployment", "server")["spec"]["template"]["spec"]
    return next((v for v in pod["volumes"] if v["name"] == "kvcache"), None)


def lmcache_yaml(objs: list[dict]) -> dict:
    return yaml.safe_load(next(o for o in find(objs, "ConfigMap") if "lmcache.yaml" in o["data"])["data"]["lmcache.yaml"])


def test_off_by_default():
    objs = render_values({})
    assert kv_volume(objs) is None
    assert all(m["mountPath"] != MOUNT for m in server_container(objs)["volumeMounts"])
    assert "local_disk" not in lmcache_yaml(objs)


@pytest.mark.parametrize(("over", "source"), [
    ({}, {"emptyDir": {"sizeLimit": "63Gi"}}),
    ({"volume": "pvc", "pvc": {"claimName": "kv"}}, {"persistentVolumeClaim": {"claimName": "kv"}}),
    ({"volume": "hostPath", "hostPath": {"path": "/nvme/kv"}}, {"hostPath": {"path": "/nvme/kv", "type": "DirectoryOrCreate"}}),
])
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_each_volume_kind_mounts_at_the_conventional_path_and_validates(over, source, kube_version):
    objs = render_values(disk(**over))
    assert kv_volume(objs) == {"name": "kvcache", **source}
    mount = next(m for m in server_container(objs)["volumeMounts"] if m["name"] == "kvcache")
    assert mount == {"name": "kvcache", "mountPath": MOUNT}  # writable
    cfg = lmcache_yaml(objs)
    assert cfg["local_disk"] == f"file://{MOUNT}" and cfg["max_local_disk_size"] == 50
    assert cfg["extra_config"] == {"use_odirect": True}
    for obj in objs:
        validate_object(obj, kube_version)


def test_the_size_and_odirect_follow_the_values():
    objs = render_values(disk(sizeGiB=200, odirect=False))
    assert kv_volume(objs)["emptyDir"]["sizeLimit"] == "251Gi"  # a quarter over: the server trims every 30 s
    cfg = lmcache_yaml(objs)
    assert cfg["max_local_disk_size"] == 200 and cfg["extra_config"] == {"use_odirect": False}


@pytest.mark.parametrize(("values", "message"), [
    (disk(volume="pvc"), "lmcache.disk.volume=pvc needs lmcache.disk.pvc.claimName"),
    (disk(volume="hostPath"), "lmcache.disk.volume=hostPath needs lmcache.disk.hostPath.path"),
    ({"lmcache": {"enabled": False, "disk": {"enabled": True}}, "sharedCache": {"mode": "none"}},
     "lmcache.disk.enabled needs lmcache.enabled=true"),
    ({"lmcache": {"disk": {"enabled": True}, "config": {"local_disk": "file:///x"}}}, "remove them from lmcache.config"),
    (disk(volume="nfs"), "at '/lmcache/disk/volume': value must be one of"),
    (disk(sizeGiB=0), "at '/lmcache/disk/sizeGiB'"),
])
def test_inconsistent_disk_values_are_refused_with_a_message(values, message):
    with pytest.raises(Exception) as excinfo:
        render_values(values)
    assert message in str(excinfo.value), str(excinfo.value)


def test_rendered_disk_tier_loads_with_lmi_server_config(tmp_path):
    values = disk(sizeGiB=2)
    values["lmcache"]["config"] = {"max_local_cpu_size": 1}  # sized for this host
    objs = render_values(values)
    model_dir, env = materialize_pod(objs, tmp_path / "root")
    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(model_dir)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout)["lmcache_plan"]
    assert plan["tiers"]["disk"]["path"] == str(tmp_path / "root" / MOUNT.lstrip("/"))
    assert plan["tiers"]["disk"]["size_bytes"] == 2 * 2**30  # the limit the server keeps
    argv = plan["server_argv"]
    l2 = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--l2-adapter"]
    assert l2[0]["type"] == "fs" and l2[0]["base_path"].endswith(MOUNT)
    assert any("namespace" in r for r in plan["reasons"])
