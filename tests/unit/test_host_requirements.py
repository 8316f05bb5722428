"""What `lmi-server serve` refuses before starting the engine, and the fix each refusal names."""

from __future__ import annotations

import pytest

from lmi_server import host_requirements as hr

MIB = 1 << 20


def test_cpu_engine_needs_its_message_rings_in_dev_shm():
    need = hr.engine_shm_bytes({}, "cpu", env={})
    # broadcast ring 16 MiB x 10 + one worker's response ring 24 MiB x 10 + margin
    assert need == (160 + 240 + 32) * MIB
    assert hr.engine_shm_bytes({"tensor_parallel_size": 2}, "cpu", env={}) == (160 + 480 + 32) * MIB
    assert hr.engine_shm_bytes({}, "cpu", env={"VLLM_MQ_MAX_CHUNK_BYTES_MB": "4"}) == (40 + 240 + 32) * MIB


def test_one_gpu_runs_its_worker_in_process():
    assert hr.engine_shm_bytes({}, "cuda", env={}) == 0
    assert hr.engine_shm_bytes({"tensor_parallel_size": 4}, "cuda", env={}) == (160 + 960 + 32) * MIB
    assert hr.engine_shm_bytes({"distributed_executor_backend": "ray", "tensor_parallel_size": 2}, "cuda", env={}) == 0


def test_dockers_default_dev_shm_is_refused_with_the_fix():
    problem = hr.check_shared_memory({}, "cpu", free_bytes=64 * MIB, env={})
    assert problem is not None
    assert "64 MiB free" in problem and "432 MiB" in problem
    assert "--shm-size=1g" in problem and "--ipc=host" in problem and "medium: Memory" in problem
    assert "\n" not in problem


def test_enough_dev_shm_passes():
    assert hr.check_shared_memory({}, "cpu", free_bytes=1024 * MIB, env={}) is None
    assert hr.check_shared_memory({}, "cuda", free_bytes=64 * MIB, env={}) is None


def test_cuda_build_without_a_gpu_names_the_gpu_and_driver():
    problem = hr.check_accelerator("cuda", gpus=0)
    assert "no NVIDIA GPU" in problem and "R580" in problem and "--gpus all" in problem
    assert hr.check_accelerator("cpu", gpus=0) is None


def test_old_driver_names_the_driver_needed():
    problem = hr.check_accelerator("cuda", gpus=1, driver=550)
    assert "R550" in problem and "R580 or newer" in problem
    assert hr.check_accelerator("cuda", gpus=1, driver=580) is None


def test_driver_version_is_read_from_the_kernel_module(tmp_path):
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n")
    assert hr.nvidia_driver_major(str(f)) == 580


def test_this_venv_is_the_cpu_build():
    assert hr.vllm_build() == "cpu"


def test_check_host_raises_a_config_error(monkeypatch):
    monkeypatch.setattr(hr, "vllm_build", lambda: "cuda")
    monkeypatch.setattr(hr, "visible_nvidia_gpus", lambda: 0)
    with pytest.raises(hr.HostRequirementError, match="R580"):
        hr.check_host({})


def test_serve_exits_at_once_with_one_line(monkeypatch, capsys, tmp_path):
    """`lmi-server serve` stops before any engine start, with the cause and the fix on one line."""
    from lmi_server import cli

    monkeypatch.setattr(hr, "shm_free_bytes", lambda path="/dev/shm": 64 * MIB)
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path))
    (tmp_path / "serving.properties").write_text("option.model_id=lmi-demo\n")
    code = cli.main(["serve", "--model-dir", str(tmp_path)])
    assert code == hr.HOST_REQUIREMENT_EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shm-size" in err[0] and "64 MiB free" in err[0], err
