"""Names, files, configs and shapes are checked before anything is registered."""

from __future__ import annotations

import json

import pytest

from lmi_server.adapters.validation import AdapterInvalid, inspect_adapter, validate_name
from tests.unit.adapters.conftest import make_adapter


@pytest.mark.parametrize("name", ["a", "my-adapter", "v1.2_final", "A" * 64, "x9"])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "a\\b", "..", "a..b", ".hidden", "-x", "A" * 65, "sp ace", "é", None, 3])
def test_invalid_names(name):
    with pytest.raises(AdapterInvalid):
        validate_name(name)


def test_good_adapter(tmp_path, base_info):
    d = make_adapter(tmp_path, "good")
    spec = inspect_adapter("good", d, max_rank=8, base=base_info)
    assert spec.rank == 2 and spec.target_modules == ["q_proj", "v_proj"] and spec.weight_bytes > 0
    assert not spec.has_formatter


def test_rank_above_max(tmp_path, base_info):
    d = make_adapter(tmp_path, "big", r=16)
    with pytest.raises(AdapterInvalid, match=r"r=16 exceeds option.max_lora_rank=8"):
        inspect_adapter("big", d, max_rank=8, base=base_info)


def test_an_adapter_naming_another_base_is_accepted_when_its_tensors_match(tmp_path, base_info, caplog):
    # Fine-tuned from the hub id, served from a local directory (as on SageMaker): same tensors.
    d = make_adapter(tmp_path, "from-hub", base_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    with caplog.at_level("WARNING", logger="lmi_server.adapters.validation"):
        spec = inspect_adapter("from-hub", d, max_rank=8, base=base_info)
    assert spec.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert spec.warnings and "HuggingFaceTB/SmolLM2-135M-Instruct" in spec.warnings[0]
    assert "tensors match" in caplog.text


def test_an_adapter_naming_another_base_with_other_shapes_is_refused(tmp_path, base_info):
    d = make_adapter(tmp_path, "other", base_name="meta-llama/Llama-3-8B", hidden=16)
    with pytest.raises(AdapterInvalid, match="wrong base model"):
        inspect_adapter("other", d, max_rank=8, base=base_info)


def test_the_served_name_matching_gives_no_warning(tmp_path, base_info):
    spec = inspect_adapter("good", make_adapter(tmp_path, "good"), max_rank=8, base=base_info)
    assert spec.warnings == []


def test_shape_mismatch_means_wrong_base(tmp_path, base_info):
    d = make_adapter(tmp_path, "wide", hidden=16)
    with pytest.raises(AdapterInvalid, match="wrong base model"):
        inspect_adapter("wide", d, max_rank=8, base=base_info)


def test_target_module_missing(tmp_path, base_info):
    d = make_adapter(tmp_path, "mlp", targets=("q_proj", "gate_proj"))
    with pytest.raises(AdapterInvalid, match=r"target modules \['gate_proj'\] do not exist"):
        inspect_adapter("mlp", d, max_rank=8, base=base_info)


def test_missing_files(tmp_path, base_info):
    d = make_adapter(tmp_path, "nocfg")
    (d / "adapter_config.json").unlink()
    with pytest.raises(AdapterInvalid, match="adapter_config.json is missing"):
        inspect_adapter("nocfg", d, base=base_info)
    d = make_adapter(tmp_path, "nowt")
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterInvalid, match="adapter_model.safetensors is missing"):
        inspect_adapter("nowt", d, base=base_info)


def test_corrupt_files(tmp_path, base_info):
    d = make_adapter(tmp_path, "badjson")
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterInvalid, match="not valid JSON"):
        inspect_adapter("badjson", d, base=base_info)
    d = make_adapter(tmp_path, "garbage")
    (d / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(AdapterInvalid, match="corrupt"):
        inspect_adapter("garbage", d, base=base_info)
    d = make_adapter(tmp_path, "truncated")
    data = (d / "adapter_model.safetensors").read_bytes()
    (d / "adapter_model.safetensors").write_bytes(data[:-40])
    with pytest.raises(AdapterInvalid, match="truncated"):
        inspect_adapter("truncated", d, base=base_info)


def test_wrong_peft_type_and_rank(tmp_path, base_info):
    d = make_adapter(tmp_path, "ia3", config={"peft_type": "IA3"})
    with pytest.raises(AdapterInvalid, match="only LORA"):
        inspect_adapter("ia3", d, base=base_info)
    d = make_adapter(tmp_path, "norank")
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg["r"] = "eight"
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterInvalid, match="positive integer rank"):
        inspect_adapter("norank", d, base=base_info)
