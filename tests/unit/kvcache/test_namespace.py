"""The KV namespace: what makes a stored chunk valid is in its key."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lmi_server.kvcache import namespaced_connector
from lmi_server.kvcache.namespace import EXTRA_CONFIG_KEY, kv_identity, model_fingerprint


def model_dir(parent, name="m", weights=b"w" * 100, config=None):
    d = parent / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config or {"model_type": "llama", "torch_dtype": "float32"}))
    (d / "model.safetensors").write_bytes(weights)
    return d


def identity(model, **over):
    args = dict(revision=None, dtype="float32", kv_cache_dtype=None, chunk_size=256,
                tensor_parallel=1, pipeline_parallel=1, platform="cpu")
    args.update(over)
    return kv_identity(str(model), **args)


def test_same_files_elsewhere_share_a_namespace(tmp_path):
    a = model_dir(tmp_path, "a")
    b = model_dir(tmp_path / "copy", "a")
    assert model_fingerprint(a) == model_fingerprint(b)
    assert identity(a).namespace() == identity(b).namespace()
    ns = identity(a).namespace()
    assert ns.startswith("a-") and "@" not in ns and "/" not in ns


@pytest.mark.parametrize("change", [
    {"dtype": "bfloat16"}, {"kv_cache_dtype": "fp8"}, {"chunk_size": 512}, {"tensor_parallel": 2},
    {"platform": "cuda"},
])
def test_every_fact_changes_the_namespace(tmp_path, change):
    m = model_dir(tmp_path)
    assert identity(m).namespace() != identity(m, **change).namespace()


def test_other_weights_or_config_change_the_namespace(tmp_path):
    base = identity(model_dir(tmp_path, "m")).namespace()
    other_weights = identity(model_dir(tmp_path / "x", "m",
                                       weights=b"v" * 100)).namespace()
    other_config = identity(model_dir(tmp_path / "y", "m",
                                      config={"model_type": "llama", "torch_dtype": "bfloat16"})).namespace()
    assert len({base, other_weights, other_config}) == 3


def test_large_weights_are_sampled_head_and_tail(tmp_path):
    big = b"a" * (3 << 20)
    changed_tail = big[:-1] + b"b"
    a = model_dir(tmp_path / "p", "m", weights=big)
    b = model_dir(tmp_path / "q", "m", weights=changed_tail)
    assert model_fingerprint(a) != model_fingerprint(b)


def test_hub_model_is_named_by_id_and_revision(tmp_path):
    a = identity("org/some-model", revision="abc")
    assert a.model == "hub:org/some-model@abc" and a.namespace().startswith("some-model-")
    assert a.namespace() != identity("org/some-model", revision="def").namespace()


def vllm_config(model, namespace=None):
    extra = {"lmcache.mp.port": 1, **({EXTRA_CONFIG_KEY: namespace} if namespace else {})}
    return SimpleNamespace(model_config=SimpleNamespace(model=model),
                           kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))


def test_connector_model_name_carries_the_namespace():
    wrapped = namespaced_connector.namespaced_model_name(lambda cfg, kv=None: cfg.model_config.model)
    assert wrapped(vllm_config("/models/m", "m-123")) == "m-123"
    assert wrapped(vllm_config("/models/m")) == "/models/m"  # no namespace given: LMCache's own name
    with_layout = namespaced_connector.namespaced_model_name(lambda cfg, kv=None: cfg.model_config.model + "#dcp2")
    assert with_layout(vllm_config("/models/m", "m-123")) == "m-123#dcp2"


def test_install_is_idempotent_and_wraps_lmcache():
    from lmcache.integration.vllm import lmcache_mp_connector as mp

    namespaced_connector.install()
    first = mp.get_dcp_decorated_model_name
    namespaced_connector.install()
    assert mp.get_dcp_decorated_model_name is first and first.lmi_namespaced
