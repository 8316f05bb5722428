"""What `lmi-server serve` refuses before starting the engine, and the fix each refusal names."""

from __future__ import annotations

import pytest

from lmi_server import host_requirements as hr

MIB = 1 << 20


def test_cpu_engine_keeps_vllms_rings_where_they_fit():
    plan = hr.plan_shared_memory({}, "cpu", free_bytes=1024 * MIB, env={})
    # broadcast ring 16 MiB x 10 + one worker's response ring 24 MiB x 10 + margin
    assert (plan.broadcast_chunk_mb, plan.response_chunk_mb, plan.shrunk) == (16, 24, False)
    assert plan.need_bytes == (160 + 240 + 8) * MIB
    assert plan.environment() == {}


def test_one_gpu_runs_its_worker_in_process():
    assert hr.plan_shared_memory({}, "cuda", free_bytes=64 * MIB, env={}) is None
    plan = hr.plan_shared_memory({"tensor_parallel_size": 4}, "cuda", free_bytes=8192 * MIB, env={})
    assert plan.workers == 4 and plan.need_bytes == (160 + 960 + 8) * MIB
    assert hr.plan_shared_memory({"distributed_executor_backend": "ray", "tensor_parallel_size": 2}, "cuda",
                                 free_bytes=64 * MIB, env={}) is None


def test_dockers_default_dev_shm_gets_smaller_rings_that_fit():
    plan = hr.plan_shared_memory({}, "cpu", free_bytes=64 * MIB, env={})
    assert plan.shrunk and plan.need_bytes <= 64 * MIB
    assert (plan.broadcast_chunk_mb, plan.response_chunk_mb) == (2, 2)
    env = plan.environment()
    assert env == {"VLLM_MQ_MAX_CHUNK_BYTES_MB": "2", "LMI_VLLM_RESPONSE_CHUNK_BYTES": str(2 * MIB)}
    assert "64 MiB free" in plan.describe() and "shrunk" in plan.describe()


def test_tensor_parallel_shares_the_room_between_its_rings():
    plan = hr.plan_shared_memory({"tensor_parallel_size": 2}, "cuda", free_bytes=256 * MIB, env={})
    assert plan.shrunk and plan.need_bytes <= 256 * MIB
    assert plan.broadcast_chunk_mb == plan.response_chunk_mb == 8


def test_a_node_of_a_group_makes_rings_for_its_own_ranks_only():
    plan = hr.plan_shared_memory({"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "nnodes": 2}, "cuda",
                                 free_bytes=8192 * MIB, env={})
    assert plan.workers == 8


def test_a_chunk_the_user_set_is_kept():
    plan = hr.plan_shared_memory({}, "cpu", free_bytes=64 * MIB, env={"VLLM_MQ_MAX_CHUNK_BYTES_MB": "1"})
    assert plan.broadcast_chunk_mb == 1 and plan.response_chunk_mb == 4
    with pytest.raises(hr.HostRequirementError, match="whole number"):
        hr.plan_shared_memory({}, "cpu", free_bytes=64 * MIB, env={"VLLM_MQ_MAX_CHUNK_BYTES_MB": "big"})


@pytest.mark.parametrize("platform, fix", [
    ("docker", "--shm-size=1g"),
    ("kubernetes", "medium: Memory"),
    ("sagemaker", "option.tensor_parallel_degree"),
    ("host", "remount"),
])
def test_rings_that_cannot_fit_are_refused_with_the_platforms_fix(platform, fix):
    with pytest.raises(hr.HostRequirementError) as err:
        hr.plan_shared_memory({"tensor_parallel_size": 8}, "cuda", free_bytes=64 * MIB, env={}, platform=platform)
    message = str(err.value)
    assert "64 MiB free" in message and "8 workers" in message and fix in message and "\n" not in message
    if platform == "sagemaker":
        assert "--shm-size" not in message


def test_the_platform_is_read_from_its_environment(tmp_path):
    nowhere = str(tmp_path / "absent")
    assert hr.platform_of({"SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"}, dockerenv=nowhere) == "sagemaker"
    assert hr.platform_of({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, dockerenv=nowhere) == "kubernetes"
    marker = tmp_path / "dockerenv"
    marker.write_text("")
    assert hr.platform_of({}, dockerenv=str(marker)) == "docker"
    assert hr.platform_of({}, dockerenv=nowhere) == "host"


def test_the_plugin_gives_vllms_message_queue_the_chosen_chunk(monkeypatch):
    """In an engine process, a MessageQueue made without a chunk size gets the server's; one that
    names its own keeps it (vLLM's broadcast ring, sized by VLLM_MQ_MAX_CHUNK_BYTES_MB)."""
    from vllm.distributed.device_communicators import shm_broadcast

    from lmi_server import shm_rings

    seen = []
    monkeypatch.setattr(shm_broadcast.ShmRingBuffer, "__init__",
                        lambda self, n_reader, max_chunk_bytes, max_chunks, name=None: seen.append(max_chunk_bytes))
    monkeypatch.setattr(shm_broadcast.MessageQueue, "__init__", shm_broadcast.MessageQueue.__init__)
    monkeypatch.setenv(shm_rings.RESPONSE_CHUNK_ENV, str(2 * MIB))
    shm_rings.vllm_plugin()
    for make in (lambda: shm_broadcast.MessageQueue(1, 1), lambda: shm_broadcast.MessageQueue(1, 1, max_chunk_bytes=3 * MIB)):
        try:
            make()
        except Exception:
            pass  # the buffer is faked; only the chunk size it was asked for matters here
    assert seen == [2 * MIB, 3 * MIB]


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

    monkeypatch.setattr(hr, "shm_free_bytes", lambda path="/dev/shm": 8 * MIB)
    monkeypatch.setattr(hr, "platform_of", lambda env=None: "docker")
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path))
    (tmp_path / "serving.properties").write_text("option.model_id=lmi-demo\n")
    code = cli.main(["serve", "--model-dir", str(tmp_path)])
    assert code == hr.HOST_REQUIREMENT_EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shm-size" in err[0] and "8 MiB free" in err[0], err
