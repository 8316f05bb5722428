#!/usr/bin/env python
"""Build time and size of both images, and each container's time to /ping 200, as users run them.

    python benchmarks/containers.py

Runs tests/e2e/test_containers.py (the same builds and `docker run` commands the suite checks) with
the GPU image rebuilt, and collects what it measured: results/containers.json and .png. Stand-in
bases are built once and reused (scripts/containers.sh); "build" is the image on top of them, the
pip layers included, with Docker's layer cache off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine, save  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    figures = Path(tempfile.mkdtemp()) / "containers.json"
    # Every layer of both images built again (the stand-in bases are kept: they stand for pulled images).
    env = {**os.environ, "LMI_CONTAINER_FIGURES": str(figures), "LMI_BUILD_GPU_IMAGE": "1", "LMI_IMAGE_BUILD_ARGS": "--no-cache"}
    before = load_average()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "tests/e2e/test_containers.py"], cwd=REPO, env=env)
    if proc.returncode != 0:
        return proc.returncode
    measured = json.loads(figures.read_text())
    doc = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_before": before,
        "load_average_after": load_average(),
        "run_s": round(time.monotonic() - start, 1),
        **measured,
    }
    save("containers", doc)
    plot(doc)
    return 0


def plot(doc: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    names = ["CPU image", "GPU image"]
    sizes = [doc["cpu_image"]["bytes"] / 1e9, doc["gpu_image"]["bytes"] / 1e9]
    builds = [doc["cpu_image"]["build_s"] / 60, doc["gpu_image"]["build_s"] / 60]
    bars = left.bar(names, sizes, color=["#4c72b0", "#55a868"])
    left.bar_label(bars, labels=[f"{s:.1f} GB\nbuilt in {b:.1f} min" for s, b in zip(sizes, builds)], fontsize=8)
    left.set_ylabel("image size (GB)")
    left.set_ylim(0, max(sizes) * 1.35)
    left.set_title("images (on stand-in bases)", fontsize=9)
    runs = [
        ("docker run IMAGE\n(64 MiB /dev/shm)\nassistant", doc["cpu_default_model"]["ready_s"]),
        ("SageMaker layout\nkit model, :ro", doc["cpu_sagemaker_layout"]["ready_s"]),
    ]
    bars = right.bar([r[0] for r in runs], [r[1] for r in runs], color=["#4c72b0", "#8172b2"])
    right.bar_label(bars, labels=[f"{r[1]:.0f} s" for r in runs], fontsize=8)
    right.set_ylabel("seconds")
    right.set_title("CPU container: time to exit / to /ping 200", fontsize=9)
    right.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"load average {doc['load_average_before'][0]} -> {doc['load_average_after'][0]}, {doc['machine']['cpus']} cores", fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "containers.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
