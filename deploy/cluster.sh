#!/usr/bin/env bash
# Local scale-out cluster on 127.0.0.1: Redis (LMCache's shared tier) + lmi-server replicas + vllm-router,
# started from the Helm chart's rendered values (default deploy/helm/lmi-server/values-cpu.yaml).
#   deploy/cluster.sh up [--values FILE ...] [--set KEY=VALUE ...] [--replicas N] [--policy P] [--no-shared-cache]
#                        [--shared-cache-password-file FILE] [--prop KEY=VALUE]
#   deploy/cluster.sh status
#   deploy/cluster.sh down
# State (pid files, logs, generated serving.properties / LMCache YAML): $LMI_CLUSTER_DIR or /tmp/lmi-cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" deploy/cluster.py "$@"
