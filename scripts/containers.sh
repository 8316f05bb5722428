#!/usr/bin/env bash
# Build and run the project's images on a host that has Docker's daemon package but no registry.
#
# Why: the images are the first way this server is used (`docker run`, SageMaker), so the test suite
# builds and runs them. Registry base images cannot be pulled here, so local stand-ins are made from
# Debian's packages (debootstrap) and PyPI, tagged under lmi-standin/, and passed to the Dockerfiles
# through their BASE_IMAGE build argument; a real build leaves the argument at its default.
#
#   scripts/containers.sh daemon-up          start dockerd (bridge-less) unless one answers
#   scripts/containers.sh daemon-down        stop the dockerd this script started
#   scripts/containers.sh base cpu|gpu       build the stand-in base for an image
#   scripts/containers.sh build cpu|gpu      build the stand-in base (if missing), then the image
#   scripts/containers.sh tag cpu|gpu        print the image's tag
#
# Environment: LMI_DOCKER_ROOT (dockerd's data folder), LMI_IMAGE_PREFIX (image names),
# LMI_DEBIAN_MIRROR (debootstrap's mirror; apt's own by default), LMI_IMAGE_BUILD_ARGS (more
# `docker build` arguments for the images, e.g. --no-cache).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DOCKER_ROOT="${LMI_DOCKER_ROOT:-/var/lib/lmi-docker}"
RUN_DIR="${LMI_DOCKER_RUN:-/run/lmi-docker}"
PIDFILE="$RUN_DIR/dockerd.pid"
PREFIX="${LMI_IMAGE_PREFIX:-lmi-server}"
STANDIN_BOOKWORM="lmi-standin/bookworm:minbase"
STANDIN_CPU_BASE="lmi-standin/python:3.11-slim"
STANDIN_GPU_BASE="lmi-standin/vllm-openai:v0.32.0"
# vLLM's CUDA build as vllm/vllm-openai:v0.32.0 carries it (the GPU Dockerfile's base).
VLLM_GPU_PIN="vllm==0.32.0"

log() { printf '[containers] %s\n' "$*" >&2; }

daemon_answers() { timeout 10 docker info >/dev/null 2>&1; }

daemon_up() {
    if daemon_answers; then log "dockerd answers"; return 0; fi
    command -v dockerd >/dev/null || { log "dockerd not found: apt-get install docker.io"; exit 2; }
    mkdir -p "$DOCKER_ROOT" "$RUN_DIR"
    # Bridge-less: no address range, no iptables; builds and runs use --network host.
    nohup dockerd --data-root "$DOCKER_ROOT" --exec-root "$RUN_DIR/exec" --pidfile "$PIDFILE" \
        --host "unix:///var/run/docker.sock" --bridge=none --iptables=false --ip-masq=false \
        >"$RUN_DIR/dockerd.log" 2>&1 &
    echo "$!" >"$RUN_DIR/started-by-script"
    for _ in $(seq 1 60); do daemon_answers && { log "dockerd started (pid $(cat "$RUN_DIR/started-by-script"))"; return 0; }; sleep 1; done
    log "dockerd did not answer within 60 s; see $RUN_DIR/dockerd.log"; tail -20 "$RUN_DIR/dockerd.log" >&2; exit 1
}

daemon_down() {
    local marker="$RUN_DIR/started-by-script"
    [ -f "$marker" ] || { log "no dockerd started by this script"; return 0; }
    local pid; pid="$(cat "$marker")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"; for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$marker"; log "dockerd stopped"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# Build a stand-in base from CTX/Dockerfile unless TAG was built from the same recipe (a label
# carries the recipe's digest, so a changed recipe rebuilds on a host that kept an older image).
standin_build() {
    local tag="$1" ctx="$2" digest have
    digest="$(sha256sum "$ctx/Dockerfile" | cut -c1-16)"
    have="$(docker image inspect --format '{{index .Config.Labels "lmi.standin.recipe"}}' "$tag" 2>/dev/null || true)"
    if [ "$have" = "$digest" ]; then rm -rf "$ctx"; return 0; fi
    log "building $tag (recipe $digest)"
    docker build --network host --label "lmi.standin.recipe=$digest" -t "$tag" "$ctx" >"$ctx.log" 2>&1 \
        || { tail -30 "$ctx.log" >&2; rm -rf "$ctx" "$ctx.log"; exit 1; }
    rm -rf "$ctx" "$ctx.log"
}

bookworm_base() {
    image_exists "$STANDIN_BOOKWORM" && return 0
    command -v debootstrap >/dev/null || { log "debootstrap not found: apt-get install debootstrap"; exit 2; }
    local mirror="${LMI_DEBIAN_MIRROR:-}"
    if [ -z "$mirror" ]; then
        # apt's own mirror: a one-line "deb URL" or a deb822 "URIs: URL", never a commented line.
        mirror="$(grep -hE '^[[:space:]]*(deb[[:space:]]|URIs:)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | grep -oE 'https?://[^ ]+/debian/?([[:space:]]|$)' | head -1 | tr -d '[:space:]' || true)"
        mirror="${mirror:-http://deb.debian.org/debian}"
    fi
    local dir; dir="$(mktemp -d)"
    log "debootstrap bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    tar -C "$dir" -c . | docker import - "$STANDIN_BOOKWORM" >/dev/null
    rm -rf "$dir" "$dir.log"
}

# This host's trust store and wheel folder go into stand-in bases only, never into a real image.
host_build_files() {
    local ctx="$1"
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
    mkdir -p "$ctx/wheels"
    if [ "${2:-}" = with-wheels ] && [ -d /opt/wheels ]; then cp /opt/wheels/*.whl "$ctx/wheels/" 2>/dev/null || true; fi
}

cpu_base() {
    bookworm_base
    local ctx; ctx="$(mktemp -d)"
    host_build_files "$ctx" with-wheels
    # python:3.11-slim's shape: python, pip on PATH, the C headers (torch's compiler needs Python.h);
    # bookworm's python3 is 3.11.
    cat >"$ctx/Dockerfile" <<EOF
FROM $STANDIN_BOOKWORM
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /usr/local/python
COPY host-ca.crt /etc/ssl/certs/host-ca.crt
COPY wheels /opt/host-wheels
ENV PATH=/usr/local/python/bin:\$PATH PIP_CERT=/etc/ssl/certs/host-ca.crt SSL_CERT_FILE=/etc/ssl/certs/host-ca.crt \
    PIP_FIND_LINKS=/opt/host-wheels PIP_RETRIES=1 PIP_TIMEOUT=20 PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
EOF
    standin_build "$STANDIN_CPU_BASE" "$ctx"
}

# A CPython 3.12 to stand in for the one vLLM's image carries (Debian has none): the host's own build
# when it has one (pyenv), else bookworm's 3.11.
host_python312() {
    local root="${PYENV_ROOT:-$HOME/.pyenv}" dir
    for dir in "$root"/versions/3.12.*; do
        [ -x "$dir/bin/python3.12" ] && { echo "$dir"; return 0; }
    done
    return 1
}

# The GPU stand-in's recipe: what vllm/vllm-openai has, a system python3 (3.12) with pip and vLLM's
# CUDA wheels installed system-wide.
gpu_recipe() {
    local py312 python_step path_step=""
    if py312="$(host_python312)"; then
        # Console scripts (vllm, lmi-server) land in the interpreter's bin, on PATH as in vLLM's image.
        path_step="ENV PATH=$py312/bin:\$PATH"
        python_step="COPY python312 $py312
RUN ln -sf $py312/bin/python3.12 /usr/local/bin/python3 && ln -sf $py312/bin/python3.12 /usr/local/bin/python3.12 && python3 -m pip --version"
    else
        python_step="RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-dev && rm -rf /var/lib/apt/lists/* && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"
    fi
    cat <<EOF
FROM $STANDIN_BOOKWORM
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ libnuma1 ca-certificates libssl3 \
    libsqlite3-0 libffi8 zlib1g libbz2-1.0 liblzma5 libreadline8 libncursesw6 libgdbm6 libuuid1 \
    && rm -rf /var/lib/apt/lists/*
$python_step
COPY host-ca.crt /etc/ssl/certs/host-ca.crt
ENV PIP_CERT=/etc/ssl/certs/host-ca.crt SSL_CERT_FILE=/etc/ssl/certs/host-ca.crt PIP_RETRIES=1 PIP_TIMEOUT=20 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m pip install --no-cache-dir "$VLLM_GPU_PIN"
$path_step
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
EOF
}

gpu_base() {
    bookworm_base
    local ctx py312
    ctx="$(mktemp -d)"
    host_build_files "$ctx"
    if py312="$(host_python312)"; then
        log "Python 3.12 for the stand-in: $py312"
        # The build keeps its prefix (compiled into it); the interpreter, its library and pip travel.
        mkdir -p "$ctx/python312"
        tar -C "$py312" --exclude='./lib/python3.12/test' --exclude='./lib/python3.12/site-packages/*.pth' \
            --exclude='__pycache__' -c . | tar -C "$ctx/python312" -x
    else
        log "no Python 3.12 on this host: the GPU stand-in carries bookworm's Python 3.11"
    fi
    gpu_recipe >"$ctx/Dockerfile"
    standin_build "$STANDIN_GPU_BASE" "$ctx"
}

tag_of() { echo "$PREFIX:$1"; }

build_image() {
    local flavour="$1" dockerfile base
    case "$flavour" in
        cpu) cpu_base; dockerfile="$ROOT/Dockerfile.cpu"; base="$STANDIN_CPU_BASE" ;;
        gpu) gpu_base; dockerfile="$ROOT/Dockerfile"; base="$STANDIN_GPU_BASE" ;;
        *) log "build cpu|gpu"; exit 2 ;;
    esac
    log "building $(tag_of "$flavour") from $base"
    # shellcheck disable=SC2086
    docker build --network host ${LMI_IMAGE_BUILD_ARGS:-} --build-arg "BASE_IMAGE=$base" -f "$dockerfile" -t "$(tag_of "$flavour")" "$ROOT"
    docker image prune -f >/dev/null  # the previous build's layers, now untagged
}

case "${1:-}" in
    daemon-up) daemon_up ;;
    daemon-down) daemon_down ;;
    base) daemon_up; case "${2:-}" in cpu) cpu_base ;; gpu) gpu_base ;; *) log "base cpu|gpu"; exit 2 ;; esac ;;
    build) daemon_up; build_image "${2:-}" ;;
    tag) tag_of "${2:-}" ;;
    gpu-recipe) gpu_recipe ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
