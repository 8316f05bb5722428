"""A failed start is named in one line: the known causes with their fix, anything else by its last line."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from lmi_server import engine_errors
from lmi_server.host_requirements import MIN_NVIDIA_DRIVER
from lmi_server.startup_failure import Context, diagnose

# What vLLM's server process raises when an engine process failed during start-up.
CORE_FAILED = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}")
WORKER_FAILED = "Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause."

CASES = [
    # (name, this process's exception, errors the engine processes reported, cause words, fix words)
    ("no_accelerator", RuntimeError("Failed to infer device type, please set the environment variable `VLLM_LOGGING_LEVEL=DEBUG`"), [],
     "no NVIDIA GPU", f"driver R{MIN_NVIDIA_DRIVER} or newer"),
    ("no_accelerator", CORE_FAILED, ["RuntimeError: No CUDA GPUs are available"], "no NVIDIA GPU", "--gpus all"),
    ("nvidia_driver_too_old", CORE_FAILED,
     ["RuntimeError: The NVIDIA driver on your system is too old (found version 12020)."], "driver is too old", "R580"),
    ("shared_memory", CORE_FAILED,
     ["RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 MiB required, 64 MiB free"],
     "/dev/shm", "--shm-size"),
    ("weights_corrupt", CORE_FAILED,
     ["SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered", WORKER_FAILED],
     "corrupt or truncated", "copy or download the model again"),
    ("weights_corrupt", CORE_FAILED, ["SafetensorError: Error while deserializing header: HeaderTooLarge"],
     "corrupt or truncated", "checksum"),
    ("weights_unreadable", CORE_FAILED,
     ["PermissionError: [Errno 13] Permission denied: '/opt/ml/model/model.safetensors'"], "cannot be read", "chmod"),
    ("weights_missing", CORE_FAILED, ["RuntimeError: Cannot find any model weights with `/opt/ml/model`"],
     "no weights", "safetensors"),
    ("out_of_memory", CORE_FAILED, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
     "out of memory", "more memory"),
    ("out_of_memory", CORE_FAILED,
     ["ValueError: Available memory on node 0 (6.36/7.71 GiB) on startup is less than desired CPU memory utilization (0.92, 7.09 GiB)."],
     "out of memory", "option.max_model_len"),
    ("killed", RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': -9}"), [],
     "out-of-memory killer", "more memory"),
    ("kv_cache_too_small", CORE_FAILED,
     ["ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is needed, "
      "which is larger than the available KV cache memory (4.00 GiB)."], "max_model_len", "lower option.max_model_len"),
]


@pytest.mark.parametrize("name,exc,reported,cause_words,fix_words", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_known_causes_name_the_fix(name, exc, reported, cause_words, fix_words):
    failure = diagnose(exc, reported, Context(build="cuda", model="/opt/ml/model"))
    assert failure.name == name, failure
    line = failure.line()
    assert "\n" not in line
    assert cause_words in line and fix_words in line, line
    assert "fix: " in line and "see the log above" not in line


def test_the_root_cause_reported_first_wins_over_the_wrappers():
    failure = diagnose(CORE_FAILED, ["SafetensorError: incomplete metadata, file not fully covered", WORKER_FAILED])
    assert failure.name == "weights_corrupt"
    assert failure.detail.startswith("SafetensorError")


def test_no_device_on_the_cpu_build_does_not_ask_for_a_gpu():
    failure = diagnose(RuntimeError("Failed to infer device type"), [], Context(build="cpu"))
    assert failure.name == "no_accelerator"
    assert "NVIDIA" not in failure.line() and "CPU" in failure.line()


def test_a_loading_timeout_names_the_option_and_the_limit():
    failure = diagnose(asyncio.TimeoutError(), [], Context(loading_timeout_s=900))
    assert failure.name == "loading_timeout"
    assert "option.model_loading_timeout (900 s)" in failure.line() and "raise option.model_loading_timeout" in failure.line()


def test_an_unknown_cause_is_the_errors_last_line_and_points_at_the_log():
    failure = diagnose(CORE_FAILED, ["ImportError: cannot import name 'frobnicate' from 'transformers'", WORKER_FAILED])
    assert failure.name == "unknown" and not failure.known
    assert failure.line() == (
        "engine start-up failed: ImportError: cannot import name 'frobnicate' from 'transformers'; see the log above"
    )
    # Nothing reported by the engine processes: this process's own exception, on one line.
    failure = diagnose(ValueError("bad value\nsecond line"), [])
    assert failure.line() == "engine start-up failed: ValueError: bad value second line; see the log above"


def test_a_chained_exception_is_searched_through_its_causes():
    try:
        try:
            raise OSError("No space left on device: '/dev/shm/psm_1234'")
        except OSError as inner:
            raise RuntimeError("engine start-up failed") from inner
    except RuntimeError as outer:
        failure = diagnose(outer, [])
    assert failure.name == "shared_memory"


def test_details_are_kept_short():
    failure = diagnose(RuntimeError("x" * 5000), [])
    assert len(failure.line()) < 400


def test_engine_processes_report_their_fatal_errors_through_the_file(monkeypatch):
    reports = engine_errors.ErrorReports()
    try:
        reports.arm()
        handler = engine_errors.ErrorReportHandler(str(reports.path))
        logger = logging.getLogger("vllm.test_engine_errors")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.error("no exception: not reported")
            try:
                try:
                    raise ValueError("the root cause")
                except ValueError as inner:
                    raise RuntimeError("the wrapper") from inner
            except RuntimeError:
                logger.exception("WorkerProc failed to start.")
        finally:
            logger.removeHandler(handler)
        assert reports.errors() == ["ValueError: the root cause", "RuntimeError: the wrapper"]
        assert json.loads(reports.path.read_text().splitlines()[0])["logger"] == "vllm.test_engine_errors"
        reports.arm()  # a new build starts from an empty file
        assert reports.errors() == []
    finally:
        reports.close()
    assert not reports.path.exists()
    assert engine_errors.ENV not in __import__("os").environ


def test_the_plugin_does_nothing_unless_the_server_asked(monkeypatch):
    monkeypatch.delenv(engine_errors.ENV, raising=False)
    before = list(logging.getLogger("vllm").handlers)
    engine_errors.vllm_plugin()
    assert logging.getLogger("vllm").handlers == before


def test_vllm_loads_the_report_plugin_in_its_processes():
    """Registered as a vLLM general plugin (pyproject.toml), which vLLM calls in each engine process.
    A stale lmi_server.egg-info beside the sources hides it: reinstall (make setup)."""
    from importlib.metadata import entry_points

    values = [ep.value for ep in entry_points(group="vllm.general_plugins")]
    assert "lmi_server.engine_errors:vllm_plugin" in values, values
