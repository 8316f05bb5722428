"""The tensor-parallel degree on faked GPU inventories, over the config.json of real models
(tests/data/model_configs, no weights): the default and `max` pick a degree vLLM accepts, a
degree vLLM would refuse is a start-up error naming the ones it accepts, and a model too big for
the GPUs says how many GPUs of that size it needs."""

from __future__ import annotations

import glob
import json
import os
import stat
from pathlib import Path

import pytest

from lmi_server.config import host
from lmi_server.config.loader import load_serving_config
from lmi_server.config.schema import ConfigError, ServingConfig, build_serving_config
from lmi_server.config.tp_rules import ShardShape
from lmi_server.config.weights import count_parameters, estimate_weight_bytes

MODELS = Path(__file__).parents[2] / "data" / "model_configs"
GIB = 1 << 30
# GPU size in GB -> what nvidia-smi says of it (name, MiB)
CARDS = {24: ("NVIDIA A10G", 23028), 80: ("NVIDIA H100 80GB HBM3", 81559), 141: ("NVIDIA H200", 143771)}
COUNTS = (1, 2, 4, 8)


def fake_nvidia_smi(bin_dir: Path, count: int, card: int) -> None:
    """An `nvidia-smi` that lists `count` GPUs of one size for `-L` and the memory query."""
    name, mib = CARDS[card]
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-L" ]; then\n'
        + "".join(f'  echo "GPU {i}: {name} (UUID: GPU-0000000{i}-fake)"\n' for i in range(count))
        + "else\n"
        + "".join(f'  echo "{name}, {mib}"\n' for _ in range(count))
        + "fi\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """Fake an inventory: `gpus(8, 80)` is 8 x H100 80GB."""

    def make(count: int, card: int = 80) -> None:
        bin_dir = tmp_path / f"bin-{count}x{card}"
        fake_nvidia_smi(bin_dir, count, card)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(count)))

    return make


def resolve(model: str, props: dict[str, str] | None = None) -> ServingConfig:
    return build_serving_config(dict(props or {}), MODELS / model)


def problems(model: str, props: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        resolve(model, props)
    return info.value.problems


# (model, GPU size) -> for 1, 2, 4, 8 GPUs: the degree chosen, or ("needs", N) GPUs of that size.
EXPECTED: dict[tuple[str, int], tuple] = {
    ("Qwen2.5-7B-Instruct", 24): (1, 2, 4, 4),
    ("Qwen2.5-7B-Instruct", 80): (1, 2, 4, 4),
    ("Qwen2.5-7B-Instruct", 141): (1, 2, 4, 4),
    ("Qwen2.5-72B-Instruct", 24): (("needs", 8), ("needs", 8), ("needs", 8), 8),
    ("Qwen2.5-72B-Instruct", 80): (("needs", 2), 2, 4, 8),
    ("Qwen2.5-72B-Instruct", 141): (("needs", 2), 2, 4, 8),
    ("Llama-3.1-8B", 24): (1, 2, 4, 8),
    ("Llama-3.1-8B", 80): (1, 2, 4, 8),
    ("Llama-3.1-70B", 24): (("needs", 8), ("needs", 8), ("needs", 8), 8),
    ("Llama-3.1-70B", 80): (("needs", 2), 2, 4, 8),
    ("Llama-3.1-70B", 141): (("needs", 2), 2, 4, 8),
    ("Mistral-7B-Instruct-v0.3", 24): (1, 2, 4, 8),
    ("Mistral-7B-Instruct-v0.3", 141): (1, 2, 4, 8),
    ("Qwen3-VL-8B-Instruct", 24): (1, 2, 4, 8),
    ("Qwen3-VL-8B-Instruct", 80): (1, 2, 4, 8),
    ("gpt-oss-120b", 24): (("needs", 4), ("needs", 4), 4, 8),
    ("gpt-oss-120b", 80): (1, 2, 4, 8),
    ("DeepSeek-V3", 24): (("needs", 48),) * 4,
    ("DeepSeek-V3", 80): (("needs", 16),) * 4,
    ("DeepSeek-V3", 141): (("needs", 8), ("needs", 8), ("needs", 8), 8),
}


@pytest.mark.parametrize("model,card", sorted(EXPECTED))
@pytest.mark.parametrize("how", [{}, {"option.tensor_parallel_degree": "max"}], ids=["default", "max"])
def test_default_and_max_pick_the_largest_degree_vllm_accepts_that_fits(model, card, how, gpus):
    for count, want in zip(COUNTS, EXPECTED[model, card]):
        gpus(count, card)
        if isinstance(want, tuple):
            (found,) = problems(model, how)
            name = CARDS[card][0]
            assert f"the model needs {want[1]} GPUs of" in found and name in found, (count, found)
            assert found.startswith("option.tensor_parallel_degree")
        else:
            cfg = resolve(model, how)
            assert cfg.engine_args["tensor_parallel_size"] == want, (count, cfg.defaults)
            assert "vLLM accepts" in cfg.defaults["tensor_parallel_size"]


def test_qwen_7b_on_eight_h100_gets_four_and_says_why(gpus):
    gpus(8, 80)
    cfg = resolve("Qwen2.5-7B-Instruct")
    why = cfg.defaults["tensor_parallel_size"]
    assert cfg.engine_args["tensor_parallel_size"] == 4
    assert "8 is refused: its 28 attention heads are not divisible by 8" in why and "accepted: 1, 2, 4" in why
    assert "GiB per GPU" in why  # the weights were checked against the GPUs


@pytest.mark.parametrize(
    "model,degree,reason,accepted",
    [
        ("Qwen2.5-7B-Instruct", 8, "28 attention heads are not divisible by 8", "1, 2, 4"),
        ("Qwen2.5-7B-Instruct", 7, "4 KV heads and 7 divide neither way", "1, 2, 4"),
        ("Qwen2.5-7B-Instruct", 6, "28 attention heads are not divisible by 6", "1, 2, 4"),
        ("Llama-3.1-8B", 3, "32 attention heads are not divisible by 3", "1, 2, 4, 8"),
        ("Qwen3-VL-8B-Instruct", 6, "32 attention heads are not divisible by 6", "1, 2, 4, 8"),
        ("gpt-oss-120b", 16, "8 KV heads are not divisible by 16", "1, 2, 4, 8"),
    ],
)
def test_a_degree_vllm_refuses_is_a_startup_error_naming_the_accepted_ones(model, degree, reason, accepted, gpus):
    gpus(16 if degree == 16 else 8, 141)
    (found,) = problems(model, {"option.tensor_parallel_degree": str(degree)})
    assert found.startswith(f"option.tensor_parallel_degree={degree}: vLLM refuses it")
    assert reason in found and found.endswith(f"visible: {accepted}")


def test_a_refused_degree_is_refused_on_a_cpu_host_too(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (found,) = problems("Qwen2.5-7B-Instruct", {"option.tensor_parallel_degree": "8"})
    assert "28 attention heads are not divisible by 8" in found and found.endswith(": 1, 2, 4")


def test_an_accepted_degree_is_kept_as_given(gpus):
    gpus(8, 80)
    cfg = resolve("Qwen2.5-72B-Instruct", {"option.tensor_parallel_degree": "4"})
    assert cfg.engine_args["tensor_parallel_size"] == 4 and "tensor_parallel_size" not in cfg.defaults


def test_more_ranks_than_visible_gpus_is_refused(gpus):
    gpus(4, 80)
    (found,) = problems("Llama-3.1-8B", {"option.tensor_parallel_degree": "8"})
    assert "more GPUs than the 4 GPUs visible" in found and found.endswith("visible: 1, 2, 4")
    gpus(2, 80)
    (found,) = problems("Llama-3.1-8B", {"option.tensor_parallel_degree": "2", "option.pipeline_parallel_degree": "2"})
    assert "2 x pipeline 2 engine ranks" in found


@pytest.mark.parametrize(
    "model,card,degree,needs",
    [
        ("Llama-3.1-70B", 80, 1, "needs 2 GPUs of 79.6 GiB (NVIDIA H100 80GB HBM3): tensor_parallel_degree=2"),
        ("Qwen2.5-72B-Instruct", 24, 4, "needs 8 GPUs of 22.5 GiB (NVIDIA A10G): tensor_parallel_degree=8"),
        ("gpt-oss-120b", 24, 2, "needs 4 GPUs of 22.5 GiB (NVIDIA A10G): tensor_parallel_degree=4"),
        ("DeepSeek-V3", 80, 8, "needs 16 GPUs of 79.6 GiB (NVIDIA H100 80GB HBM3): tensor_parallel_degree=16"),
        ("DeepSeek-V3", 24, 8, "needs 48 GPUs of 22.5 GiB (NVIDIA A10G): tensor_parallel_degree=16 (the most vLLM "
                               "accepts) x pipeline_parallel_degree=3"),
    ],
)
def test_a_model_too_big_for_the_gpus_says_how_many_it_needs(model, card, degree, needs, gpus):
    gpus(8, card)
    (found,) = problems(model, {"option.tensor_parallel_degree": str(degree)})
    assert found.startswith(f"option.tensor_parallel_degree={degree}: the model's weights")
    assert "estimated from config.json" in found and needs + ";" in found + ";"


def test_weights_offloaded_to_cpu_or_quantized_at_load_count(gpus):
    gpus(1, 80)
    assert problems("Llama-3.1-70B")  # 131 GiB of bf16 weights on one 80 GB GPU
    assert resolve("Llama-3.1-70B", {"option.quantization": "fp8"}).engine_args["tensor_parallel_size"] == 1
    assert resolve("Llama-3.1-70B", {"option.cpu_offload_gb": "64"}).engine_args["tensor_parallel_size"] == 1


def test_local_safetensors_size_wins_over_the_estimate(gpus, tmp_path):
    model = tmp_path / "llama-70b-awq"
    model.mkdir()
    (model / "config.json").write_text((MODELS / "Llama-3.1-70B" / "config.json").read_text())
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 40 * GIB}}))
    gpus(1, 80)
    cfg = build_serving_config({}, model)
    assert cfg.engine_args["tensor_parallel_size"] == 1 and "safetensors" in cfg.defaults["tensor_parallel_size"]


def test_pipeline_and_data_parallel_ranks_share_the_gpus(gpus):
    gpus(8, 80)
    cfg = resolve("Llama-3.1-8B", {"option.pipeline_parallel_degree": "2"})
    assert cfg.engine_args["tensor_parallel_size"] == 4
    cfg = resolve("Qwen2.5-7B-Instruct", {"option.data_parallel_size": "2"})
    assert cfg.engine_args["tensor_parallel_size"] == 4  # 8 / 2 ranks = 4, and 4 is accepted


def test_sagemakers_gpu_count_is_a_bound_like_max(gpus, tmp_path):
    gpus(8, 80)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((MODELS / "Qwen2.5-7B-Instruct" / "config.json").read_text())
    cfg = load_serving_config(model, environ={"SM_NUM_GPUS": "8"})
    assert cfg.engine_args["tensor_parallel_size"] == 4 and "SM_NUM_GPUS" in cfg.defaults["tensor_parallel_size"]
    with pytest.raises(ConfigError, match="28 attention heads"):  # a degree someone chose is checked
        load_serving_config(model, environ={"TENSOR_PARALLEL_DEGREE": "8"})


def test_cpu_hosts_keep_one_rank_and_hub_models_every_gpu(gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "tensor_parallel_size" not in resolve("Qwen2.5-7B-Instruct").engine_args
    assert resolve("Qwen2.5-7B-Instruct", {"option.tensor_parallel_degree": "max"}).engine_args["tensor_parallel_size"] == 1
    gpus(8, 80)
    cfg = build_serving_config({"option.model_id": "Qwen/Qwen2.5-7B-Instruct"}, MODELS / "missing")
    assert cfg.engine_args["tensor_parallel_size"] == 8 and "no local config.json" in cfg.defaults["tensor_parallel_size"]


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="a real GPU host counts its devices")
def test_inventory_comes_from_nvidia_smi_without_cuda_visible_devices(gpus, monkeypatch):
    gpus(8, 141)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    inventory = host.gpu_inventory()
    assert (inventory.count, inventory.memory_bytes_each, inventory.name) == (8, 143771 << 20, "NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert host.gpu_inventory().count == 2


# --- the numbers the rules read --------------------------------------------------------------

def config_of(model: str) -> dict:
    return json.loads((MODELS / model / "config.json").read_text())


@pytest.mark.parametrize(
    "model,billions",  # as the model cards state them (DeepSeek-V3: 671B without its MTP layer)
    [("Qwen2.5-7B-Instruct", 7.61), ("Qwen2.5-72B-Instruct", 72.7), ("Llama-3.1-8B", 8.03), ("Llama-3.1-70B", 70.6),
     ("Mistral-7B-Instruct-v0.3", 7.25), ("DeepSeek-V3", 671), ("gpt-oss-120b", 116.8), ("Qwen3-VL-8B-Instruct", 8.77)],
)
def test_parameter_counts_match_the_published_sizes(model, billions):
    count = count_parameters(config_of(model))
    assert count is not None and abs(count.total / 1e9 - billions) / billions < 0.03


def test_quantized_checkpoints_take_their_stored_bytes():
    deepseek = estimate_weight_bytes(config_of("DeepSeek-V3"), {})  # fp8 blocks: ~1 byte a parameter
    assert deepseek is not None and 620 * GIB < deepseek.bytes < 640 * GIB
    gpt_oss = estimate_weight_bytes(config_of("gpt-oss-120b"), {})  # MXFP4 experts: published ~61 GiB
    assert gpt_oss is not None and 59 * GIB < gpt_oss.bytes < 63 * GIB


def test_mla_splits_query_heads_only_and_fp8_blocks_bound_the_degree():
    shape = ShardShape.from_config(config_of("DeepSeek-V3"))
    assert shape is not None and shape.kv_heads is None
    assert shape.valid_degrees(64) == [1, 2, 4, 8, 16]  # 2048 expert intermediate / 32 = 64: half an fp8 block
    assert "not whole fp8 blocks of 128" in (shape.refusal(32) or "")


def test_vision_language_models_are_read_from_their_text_config():
    shape = ShardShape.from_config(config_of("Qwen3-VL-8B-Instruct"))
    assert shape is not None and (shape.heads, shape.kv_heads) == (32, 8)


def test_awq_groups_bound_the_degree():
    config = {**config_of("Qwen2.5-72B-Instruct"), "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    shape = ShardShape.from_config(config)
    assert shape is not None and "not whole quantization groups of 128" in (shape.refusal(8) or "")
    config["intermediate_size"] = 29696  # what Qwen's AWQ checkpoints pad it to, for 8 GPUs
    assert ShardShape.from_config(config).valid_degrees(8) == [1, 2, 4, 8]
