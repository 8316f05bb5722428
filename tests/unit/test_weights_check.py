"""A truncated safetensors file fails the start before any engine process is spawned, with the
cause the start-up diagnosis names (weights_corrupt); whole files and hub ids pass."""

import asyncio
import json

import pytest
import torch
from safetensors.torch import save_file

from lmi_server import startup_failure
from lmi_server.config.schema import build_serving_config
from lmi_server.engine import EngineOwner
from lmi_server.weights_check import check_local_weights


def model_dir(tmp_path, truncate: bool):
    d = tmp_path / "model"
    d.mkdir()
    save_file({"w": torch.zeros(64, 64)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"v": torch.ones(64, 64)}, str(d / "model-00002-of-00002.safetensors"))
    if truncate:
        second = d / "model-00002-of-00002.safetensors"
        with open(second, "r+b") as fh:
            fh.truncate(second.stat().st_size // 2)
    return d


def test_whole_files_pass_and_count(tmp_path):
    assert check_local_weights(str(model_dir(tmp_path, truncate=False))) == 2


def test_a_hub_id_or_no_model_is_left_to_vllm(tmp_path):
    assert check_local_weights("HuggingFaceTB/SmolLM2-135M-Instruct") == 0
    assert check_local_weights(None) == 0


def test_a_truncated_shard_is_the_weights_corrupt_cause(tmp_path):
    with pytest.raises(Exception) as raised:
        check_local_weights(str(model_dir(tmp_path, truncate=True)))
    assert type(raised.value).__name__ == "SafetensorError"
    failure = startup_failure.diagnose(raised.value)
    assert failure.name == "weights_corrupt", failure
    assert "SafetensorError" in failure.line()


def test_the_owner_fails_the_start_before_building_an_engine(tmp_path, monkeypatch):
    """No engine configuration is even created: the start fails on the header check alone."""
    d = model_dir(tmp_path, truncate=True)
    owner = EngineOwner(build_serving_config({}, tmp_path), {"model": str(d)})

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was built for a truncated weights file")

    monkeypatch.setattr("lmi_server.engine.build_vllm_namespace", no_engine)
    asyncio.run(owner._start())
    assert owner.state.status == "failed"
    assert owner.state.failure.name == "weights_corrupt"
    assert "the model's weights are corrupt or truncated" in owner.state.error


def test_with_an_index_only_the_files_it_names_are_checked(tmp_path):
    """A stray file vLLM does not load (named by no index entry) cannot fail a start it would survive."""
    d = model_dir(tmp_path, truncate=True)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}}))
    assert check_local_weights(str(d)) == 1
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(Exception) as raised:
        check_local_weights(str(d))
    assert type(raised.value).__name__ == "SafetensorError"
