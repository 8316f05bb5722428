"""Remove CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` beside a CPU torch.

PyPI's builds of these packages are compiled against CUDA torch; next to `torch==X+cpu` their
operators fail to register (`operator torchvision::nms does not exist`) and vLLM cannot import.
Text serving does not need them, so when they do not import cleanly they are uninstalled.
"""

from __future__ import annotations

import subprocess
import sys

CANDIDATES = ("torchvision", "torchaudio", "torchcodec")


def imports_cleanly(module: str) -> bool | None:
    """True if it imports, False if it is installed but broken, None if it is absent."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.find_spec({module!r})\n"
        "if spec is None: sys.exit(3)\n"
        f"import {module}\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode == 3:
        return None
    return proc.returncode == 0


def main() -> int:
    broken = [m for m in CANDIDATES if imports_cleanly(m) is False]
    if not broken:
        print("repair_torch: nothing to repair")
        return 0
    print(f"repair_torch: removing builds that do not match the installed torch: {broken}")
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", *broken], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
