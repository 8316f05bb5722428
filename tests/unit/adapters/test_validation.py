"""Names, files, configs and shapes are checked before anything is registered."""

from __future__ import annotations

import json

import pytest

from lmi_server.adapters.validation import AdapterInvalid, inspect_adapter, validate_name
from tests.unit.adapters.conftest import make_adapter


# LMI takes any name; SageMaker's identifiers are not documented: any printable one that stays one
# path segment of the adapter API is taken (an inference component's name, an opaque id, spaces,
# dots, non-ASCII), up to 256 characters.
@pytest.mark.parametrize("name", [
    "a", "my-adapter", "v1.2_final", "A" * 64, "x9", "adapter-chinese-1", "a..b", ".hidden", "-x", "A" * 256,
    "sp ace", "é", "ic:base", "7f3c2a9e-11b2-4c1e-9d3a-0a1b2c3d4e5f", 'quote"and\'tick',
])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", [
    "", "../etc", "a/b", "a\\b", "..", ".", "A" * 257, " lead", "trail ", "new\nline", "tab\tname", "nul\x00",
    "bell\x07", None, 3,
])
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


# ---------------------------------------------------------------- adapter_model.bin (PEFT, safe_serialization=False)


def _to_bin(d, fname="adapter_model.bin", **extra):
    """Rewrite an adapter's safetensors as the PyTorch pickle PEFT writes without safe serialization."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(d / "adapter_model.safetensors"))
    tensors.update(extra)
    (d / "adapter_model.safetensors").unlink()
    torch.save(tensors, str(d / fname))
    return d


@pytest.mark.parametrize("fname", ["adapter_model.bin", "adapter_model.pt"])
def test_a_pytorch_pickle_adapter_is_found_and_checked_like_safetensors(tmp_path, base_info, fname):
    from lmi_server.adapters.validation import has_adapter_files

    d = _to_bin(make_adapter(tmp_path, "pickled"), fname)
    assert has_adapter_files(d)
    spec = inspect_adapter("pickled", d, max_rank=8, base=base_info)
    assert spec.weights_file == fname and spec.rank == 2 and spec.weight_bytes > 0
    # the shape checks read the pickle's tensors too
    wide = _to_bin(make_adapter(tmp_path, "wide-bin", hidden=16), fname)
    with pytest.raises(AdapterInvalid, match="wrong base model"):
        inspect_adapter("wide-bin", wide, max_rank=8, base=base_info)


def test_a_pickle_that_would_run_code_is_refused_not_executed(tmp_path, base_info):
    import os

    import torch

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    d = make_adapter(tmp_path, "evil")
    (d / "adapter_model.safetensors").unlink()
    torch.save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": Payload()}, str(d / "adapter_model.bin"))
    with pytest.raises(AdapterInvalid, match=r"refused \(read with torch.load\(weights_only=True\)\).*posix.system"):
        inspect_adapter("evil", d, max_rank=8, base=base_info)
    assert not marker.exists()


def test_a_corrupt_or_non_tensor_bin_is_invalid(tmp_path, base_info):
    import torch

    d = make_adapter(tmp_path, "junk")
    (d / "adapter_model.safetensors").unlink()
    (d / "adapter_model.bin").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(AdapterInvalid, match="corrupt or not a PyTorch file"):
        inspect_adapter("junk", d, base=base_info)
    torch.save([torch.zeros(2)], str(d / "adapter_model.bin"))
    with pytest.raises(AdapterInvalid, match="must hold a dict of tensors"):
        inspect_adapter("junk", d, base=base_info)


def test_safetensors_wins_when_both_are_present(tmp_path, base_info):
    import shutil

    d = make_adapter(tmp_path, "both")
    shutil.copy(d / "adapter_model.safetensors", tmp_path / "keep.safetensors")
    _to_bin(d)
    shutil.copy(tmp_path / "keep.safetensors", d / "adapter_model.safetensors")
    assert inspect_adapter("both", d, base=base_info).weights_file == "adapter_model.safetensors"


def test_no_weights_names_every_accepted_file(tmp_path, base_info):
    d = make_adapter(tmp_path, "empty")
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterInvalid, match=r"adapter_model.safetensors is missing .*adapter_model.bin or adapter_model.pt is accepted too"):
        inspect_adapter("empty", d, base=base_info)
