"""`lmi-server config` as a user runs it: resolved JSON, or a non-zero exit naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_config(model_dir: Path, props: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (model_dir / "serving.properties").write_text(props)
    return subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(model_dir)],
        capture_output=True, text=True, cwd=REPO, env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=120,
    )


def test_prints_resolved_config_and_exact_engine_args(tmp_path):
    out = run_config(tmp_path, "engine=Python\noption.max_rolling_batch_size=8\noption.dtype=fp32\n", {"OPTION_MAX_MODEL_LEN": "2048"})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # fair admission (the default) adds option.reserved_slots (default max(2, 8 // 8)) to the batch size
    assert doc["vllm_engine_args"]["max_num_seqs"] == 10
    assert doc["fair_slots"] == {"batch_size": 8, "reserved_slots": 2, "engine_max_num_seqs": 10}
    assert doc["vllm_engine_args"]["max_model_len"] == 2048
    assert doc["vllm_engine_args"]["dtype"] == "float32"
    assert doc["not_applicable"] == {"engine": "the vLLM engine is built in"}
    assert doc["environment"]["VLLM_NO_USAGE_STATS"] == "1"
    assert doc["environment"]["LMCACHE_TRACK_USAGE"] == "false"
    assert doc["lmcache_plan"]["mode"] is None


def test_misspelt_key_exits_non_zero_with_suggestion(tmp_path):
    out = run_config(tmp_path, "option.max_rolling_batch_sise=8\n")
    assert out.returncode == 2
    assert "option.max_rolling_batch_sise" in out.stderr and "did you mean option.max_rolling_batch_size?" in out.stderr


@pytest.mark.parametrize(
    "props,needle",
    [
        ("option.lmcache_config_file=x.yaml\noption.lmcache_auto_config=true\n", "exclude each other"),
        ("option.lmcache_config_file=missing.yaml\n", "missing.yaml"),
        ("option.lmcache_config_file=bad.yaml\n", "chunk_sise"),
        ("option.lmcache_config_file=cpu.yaml\noption.lmcache_mode=inprocess\n", "GPU"),
    ],
)
def test_bad_lmcache_configuration_is_a_startup_error(tmp_path, props, needle):
    (tmp_path / "bad.yaml").write_text("chunk_sise: 256\n")
    (tmp_path / "cpu.yaml").write_text((REPO / "lmcache_configs" / "cpu.yaml").read_text())
    out = run_config(tmp_path, props)
    assert out.returncode == 2, out.stdout
    assert needle in out.stderr, out.stderr


def test_auto_config_prints_the_plan_with_reasons(tmp_path):
    from lmi_server.demo.builder import ensure_demo_model

    demo = ensure_demo_model()
    out = run_config(tmp_path, f"option.model_id={demo}\noption.lmcache_auto_config=true\noption.cpu_kv_cache_space=1\noption.max_model_len=16384\noption.max_rolling_batch_size=64\n")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["lmcache_plan"]
    assert plan["source"] == "auto"
    assert plan["reasons"] and any("bytes per token" in r.lower() or "kv" in r.lower() for r in plan["reasons"])


def test_lmi_simplified_setup_variables_reach_the_engine_arguments(tmp_path):
    env = {"MAX_BATCH_SIZE": "4", "TENSOR_PARALLEL_DEGREE": "max", "HF_REVISION": "v1", "MAX_CONCURRENT_REQUESTS": "3",
           "SAGEMAKER_NUM_MODEL_WORKERS": "2", "CUDA_VISIBLE_DEVICES": ""}
    out = run_config(tmp_path, "option.admission_policy=fifo\n", env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["vllm_engine_args"]["max_num_seqs"] == 4 and doc["vllm_engine_args"]["revision"] == "v1"
    assert doc["vllm_engine_args"]["tensor_parallel_size"] == 1  # max on a CPU host
    assert doc["server"]["job_queue_size"] == 3
    assert doc["lmi_translated"]["MAX_CONCURRENT_REQUESTS"] == "job_queue_size=3"
    assert "SAGEMAKER_NUM_MODEL_WORKERS" in doc["not_applicable"]
    assert "SAGEMAKER_NUM_MODEL_WORKERS is not applicable here" in out.stderr  # one log line says why


def test_lmi_lmcache_recipe_starts_this_servers_lmcache(tmp_path):
    recipe = 'option.kv_transfer_config={"kv_connector":"LMCacheConnectorV1", "kv_role":"kv_both"}\n'
    (tmp_path / "cpu.yaml").write_text("chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n")  # LMI's CPU-backend file
    out = run_config(tmp_path, recipe, {"LMCACHE_CONFIG_FILE": "cpu.yaml", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["lmcache"]["lmcache_config_file"] == "cpu.yaml"
    assert doc["lmcache_plan"]["mode"] == "mp"
    assert doc["vllm_engine_args"]["kv_transfer_config"]["kv_role"] == "kv_both"


def test_tensor_parallel_degree_follows_what_vllm_accepts_on_the_gpus_seen(tmp_path):
    """Qwen2.5-7B (28 heads, 4 KV heads) on a faked 8 x H100: `max` gives 4; 8 is refused by name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do\n  if [ "$1" = "-L" ]; then echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"\n'
        '  else echo "NVIDIA H100 80GB HBM3, 81559"; fi\ndone\n'
    )
    smi.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((REPO / "tests/data/model_configs/Qwen2.5-7B-Instruct/config.json").read_text())
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    out = run_config(model, "option.tensor_parallel_degree=max\n", env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["vllm_engine_args"]["tensor_parallel_size"] == 4
    assert "28 attention heads are not divisible by 8" in doc["lmi_defaults"]["tensor_parallel_size"]
    out = run_config(model, "option.tensor_parallel_degree=8\n", env)
    assert out.returncode == 2
    assert "option.tensor_parallel_degree=8: vLLM refuses it" in out.stderr and "visible: 1, 2, 4" in out.stderr
