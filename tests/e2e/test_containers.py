"""Both images built and run as their users run them: `docker run` with Docker's defaults, the
README's run command, SageMaker's `docker run IMAGE serve` with a read-only /opt/ml/model.

Base images cannot be pulled here: scripts/containers.sh builds local stand-ins and passes them as
BASE_IMAGE. The GPU image is built only with LMI_BUILD_GPU_IMAGE=1 (`make gpu-image-record`, which
writes tests/data/gpu_image_verified.json); otherwise the record of that build is judged against this
tree's inputs, stage by stage (tests/support/gpu_record.py).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import warnings
from pathlib import Path

import pytest
from openai import OpenAI

from lmi_server.host_requirements import HOST_REQUIREMENT_EXIT_CODE
from lmi_server.kvcache.resolve import free_local_port
from tests.support import containers as c
from tests.support import gpu_record

pytestmark = pytest.mark.timeout(3600)

FIGURES = Path(os.environ.get("LMI_CONTAINER_FIGURES", "")) if os.environ.get("LMI_CONTAINER_FIGURES") else None
KIT_MODEL = c.REPO / "lmi_server" / "demo" / "kit" / "target"
QWEN_7B_CONFIG = c.REPO / "tests" / "data" / "model_configs" / "Qwen2.5-7B-Instruct" / "config.json"


def record(key: str, value) -> None:
    """Figures for benchmarks/containers.py (only when it asks for them)."""
    if FIGURES is None:
        return
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    data[key] = value
    FIGURES.write_text(json.dumps(data, indent=2))


@pytest.fixture(scope="module")
def daemon():
    c.daemon_up()
    yield
    c.daemon_down()


@pytest.fixture(scope="module")
def cpu_image(daemon, tmp_path_factory):
    seconds = c.build("cpu", tmp_path_factory.mktemp("build") / "cpu.log")
    image = c.tag("cpu")
    record("cpu_image", {"build_s": round(seconds, 1), "bytes": c.image_bytes(image)})
    return image


def test_the_readmes_run_command_answers_with_dockers_defaults(cpu_image):
    """The README's command (`docker run -p 8080:8080 IMAGE`): Docker's default 64 MiB /dev/shm, no
    model; vLLM's rings are shrunk to fit and the embedded assistant answers."""
    box = c.Container(cpu_image, free_local_port()).start()
    try:
        ready_s = box.wait_ready()
        shm = c.docker("exec", box.cid, "df", "-m", "/dev/shm")
        assert shm.stdout.split()[-5] == "64", shm.stdout  # Docker's default, untouched
        client = OpenAI(base_url=box.base_url + "/v1", api_key="unused", timeout=300)
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=24,
        )
        answer = reply.choices[0].message.content
        assert "Paris" in answer, answer
        assert "rings shrunk" in box.logs(), box.logs()[-3000:]
        labels = c.docker("inspect", "-f", "{{json .Config.Labels}}", cpu_image).stdout
        assert '"com.amazonaws.sagemaker.capabilities.accept-bind-to-port":"true"' in labels, labels
        record("cpu_default_model", {"ready_s": round(ready_s, 1), "answer": answer, "shm_mib": 64})
    finally:
        box.stop()


def tree(path: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime) for p in sorted(path.rglob("*"))}


def test_sagemaker_serves_a_read_only_model_directory(cpu_image, tmp_path):
    """SageMaker's way: the model and serving.properties in /opt/ml/model (read-only), OPTION_* given
    with -e, `docker run IMAGE serve`, port 8080 unless SAGEMAKER_BIND_TO_PORT says otherwise."""
    model = tmp_path / "model"
    shutil.copytree(KIT_MODEL, model)
    (model / "serving.properties").write_text(
        "engine=Python\noption.dtype=fp32\noption.enforce_eager=true\noption.cpu_kv_cache_space=1\n"
    )
    for p in [model, *model.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
    before = tree(model)
    box = c.Container(
        cpu_image, free_local_port(), command=["serve"],
        options=["-v", f"{model}:/opt/ml/model:ro", "-e", "OPTION_MAX_MODEL_LEN=1024",
                 "-e", "OPTION_MAX_ROLLING_BATCH_SIZE=4"],
    ).start()
    try:
        ready_s = box.wait_ready()
        import httpx

        models = httpx.get(box.base_url + "/v1/models", timeout=30).json()["data"]
        assert models[0]["max_model_len"] == 1024, models  # OPTION_MAX_MODEL_LEN reached the engine
        out = httpx.post(box.base_url + "/invocations", timeout=300,
                         json={"inputs": "def add(a, b):", "parameters": {"max_new_tokens": 8, "details": True}})
        assert out.status_code == 200, out.text
        body = out.json()
        body = body[0] if isinstance(body, list) else body
        assert body["details"]["generated_tokens"] == 8 and body["generated_text"], body
        record("cpu_sagemaker_layout", {"ready_s": round(ready_s, 1)})
    finally:
        box.stop()
    assert tree(model) == before, "the server wrote into /opt/ml/model"


SAGEMAKER_PYTHON = c.REPO / ".venv-sagemaker" / "bin" / "python"


def test_sagemaker_sdk_local_mode_deploys_and_predicts(cpu_image, tmp_path):
    """SageMaker's own Python SDK (v2 local mode: `Model(image_uri=...).deploy(instance_type="local")`,
    the model archive unpacked at /opt/ml/model, `serve`, /ping, Predictor.predict) with no
    shared-memory setting, as SageMaker hosting has none: the LMI and chat schemas, a batch, an adapter
    with its output formatter, a streamed answer through the runtime client, a 400 for bad input."""
    if not SAGEMAKER_PYTHON.exists():
        pytest.fail("SageMaker's SDK is not installed: make sagemaker-client")
    model = tmp_path / "model"
    (model / "adapters").mkdir(parents=True)
    for name in ("shouter", "hello-printer"):
        shutil.copytree(c.REPO / "adapters" / name, model / "adapters" / name)
    (model / "serving.properties").write_text(
        "option.model_id=lmi-demo\noption.enable_lora=true\noption.max_loras=1\noption.dtype=fp32\n"
        "option.enforce_eager=true\noption.cpu_kv_cache_space=1\n"
    )
    work = tmp_path / "sagemaker"
    work.mkdir()
    port = free_local_port()
    done = subprocess.run([str(SAGEMAKER_PYTHON), str(c.REPO / "tests" / "support" / "sagemaker_local.py"),
                           cpu_image, str(model), str(port), str(work)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    line = next((l for l in done.stdout.splitlines() if l.startswith("SAGEMAKER_LOCAL_RESULT ")), None)
    assert done.returncode == 0 and line, (done.stdout[-4000:], done.stderr[-6000:])
    out = json.loads(line.partition(" ")[2])

    lmi = out["lmi"][0] if isinstance(out["lmi"], list) else out["lmi"]
    assert lmi["generated_text"], out["lmi"]
    assert out["chat"]["choices"][0]["message"]["content"], out["chat"]
    assert [bool(r["generated_text"]) for r in out["batch"]] == [True, True], out["batch"]
    adapted = out["adapter"][0] if isinstance(out["adapter"], list) else out["adapter"]
    base = out["base_for_adapter"][0] if isinstance(out["base_for_adapter"], list) else out["base_for_adapter"]
    text = adapted["generated_text"]
    assert text == text.upper() and any(ch.isalpha() for ch in text), out["adapter"]  # shouter's formatter
    assert text != base["generated_text"], (out["adapter"], out["base_for_adapter"])
    stream = out["stream"]
    assert stream["status"] == 200 and stream["chunks"] > 1, stream
    tokens = [json.loads(l) for l in stream["text"].splitlines() if l.strip()]
    assert len(tokens) > 1 and all("token" in t or "generated_text" in t for t in tokens), stream
    assert 400 <= out["bad"]["status"] < 500 and "max_new_tokens" in out["bad"]["body"], out["bad"]
    record("sagemaker_sdk_local_mode", {"in_service_s": out["in_service_s"], "shm_size": "Docker's default (64 MiB)"})


# --- GPU image ---------------------------------------------------------------------------------

FAKE_NVIDIA_SMI = """#!/bin/sh
# Eight H100s, as nvidia-smi prints them; the driver version of a CUDA 13.0 host.
case "$*" in
  *-L*) i=0; while [ $i -lt 8 ]; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$i)"; i=$((i+1)); done ;;
  *driver_version*) i=0; while [ $i -lt 8 ]; do echo "580.65.06"; i=$((i+1)); done ;;
  *memory.total*) i=0; while [ $i -lt 8 ]; do echo "NVIDIA H100 80GB HBM3, 81559"; i=$((i+1)); done ;;
  *) echo "NVIDIA-SMI 580.65.06"; ;;
esac
"""


def suffix_decoding_check(image: str) -> str:
    """option.speculative_method=suffix needs Arctic Inference's suffix tree: it imports and drafts in the image."""
    code, out, _ = c.run_to_exit(image, "--entrypoint", "python3", command=("-c", SUFFIX_PROBE))
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.startswith("arctic_inference="))
    assert line.endswith("draft=[6, 7]"), line  # an earlier response's continuation
    return f"the suffix tree imports and drafts ({line})"


SUFFIX_PROBE = (
    "import importlib.metadata as m; from arctic_inference.suffix_decoding import SuffixDecodingCache; "
    "cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4); "
    "cache.start_request('r', [1, 2, 3]); cache.add_active_response('r', [4, 5, 6, 7]); cache.stop_request('r'); "
    "cache.start_request('s', [9]); "
    "d = cache.speculate('s', [4, 5], max_spec_tokens=2, max_spec_factor=2.0, min_token_prob=0.0); "
    "print('arctic_inference=' + m.version('arctic-inference'), 'draft=' + str(list(d.token_ids)))"
)


def test_the_cpu_image_carries_suffix_decoding(cpu_image):
    assert "drafts" in suffix_decoding_check(cpu_image)


def config_check(image: str, tmp_path: Path) -> str:
    """`lmi-server config` for a GPU deployment prints its plan: Qwen2.5-7B-Instruct on 8 faked H100s."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    model = tmp_path / "qwen"
    model.mkdir(exist_ok=True)
    shutil.copy(QWEN_7B_CONFIG, model / "config.json")
    model.chmod(0o755)
    (model / "config.json").chmod(0o644)
    code, out, _ = c.run_to_exit(image, "-v", f"{fake}:/usr/local/bin/nvidia-smi:ro", "-v", f"{model}:/opt/ml/model:ro",
                                 command=("config", "--model-dir", "/opt/ml/model"), timeout_s=300)
    assert code == 0, out
    plan = json.loads(out[out.index("{"):out.rindex("}") + 1])
    # 28 attention heads and 4 KV heads: 4 is the most of the 8 GPUs vLLM accepts.
    assert plan["vllm_engine_args"]["tensor_parallel_size"] == 4, plan["lmi_defaults"]
    assert "8 is refused" in plan["lmi_defaults"]["tensor_parallel_size"]
    return "Qwen2.5-7B-Instruct on 8 x H100 (faked nvidia-smi): " + plan["lmi_defaults"]["tensor_parallel_size"].split(";")[0]


def gpu_checks(image: str, tmp_path: Path) -> dict[str, str]:
    """What the GPU image must do on a host without a GPU (tests/support/gpu_record.py says which
    stage of the image each check depends on)."""
    results = {"config": config_check(image, tmp_path)}
    # LMCache's CUDA ops import against the image's torch.
    code, out, _ = c.run_to_exit(image, "--entrypoint", "python3", command=(
        "-c", "import sys, lmcache.cuda_ops, torch; print('torch=' + torch.__version__, 'python=' + sys.version.split()[0])"))
    assert code == 0, out
    versions = next(line for line in out.splitlines() if line.startswith("torch="))
    assert versions.startswith("torch=2.13.0"), versions
    results["lmcache_cuda_ops"] = f"import lmcache.cuda_ops works ({versions})"
    # Suffix decoding's extension, built in the image from its pinned sdist (scripts/build_suffix_decoding.py).
    results["suffix_decoding"] = suffix_decoding_check(image)
    # `serve` without a GPU stops at once naming the GPU and the driver.
    code, out, seconds = c.run_to_exit(image, "--shm-size=1g", command=("serve",), timeout_s=300)
    assert code == HOST_REQUIREMENT_EXIT_CODE, out
    line = next(line for line in out.splitlines() if "cannot start" in line)
    assert "no NVIDIA GPU" in line and "R580" in line, line
    results["serve_without_gpu"] = f"exit {code} after {seconds:.0f} s: {line}"
    return results


GPU_STANDIN_BASE = "lmi-standin/vllm-openai:v0.32.0 (Debian bookworm, a CPython as python3, vllm==0.32.0's CUDA wheels from PyPI)"


def build_and_record_gpu_image(inputs, tmp_path: Path) -> None:
    """Build the GPU image on its stand-in base, check it, and write the record of that build."""
    c.daemon_up()
    seconds = c.build("gpu", tmp_path / "gpu.log")
    image = c.tag("gpu")
    checks = gpu_checks(image, tmp_path)
    record_ = gpu_record.new_record(inputs, base=GPU_STANDIN_BASE, build_s=seconds, image_bytes=c.image_bytes(image),
                                    checks=checks)
    gpu_record.RECORD.write_text(json.dumps(record_, indent=2) + "\n")
    record("gpu_image", {"build_s": record_["build_s"], "bytes": record_["image_bytes"], "checks": checks})


def test_gpu_image_verified_for_this_tree(request, tmp_path):
    """The GPU image, built and checked for this tree, or stood for by the record of such a build.

    CI does not build it (vLLM's CUDA wheels: about 13 min and ~20 GB); `make gpu-image-record`
    (LMI_BUILD_GPU_IMAGE=1) builds it, checks it and writes tests/data/gpu_image_verified.json. Otherwise
    the record is judged against this tree's inputs, derived from the Dockerfile
    (tests/support/gpu_record.py): every input the same, its checks stand; the dependency stage changed,
    this fails naming the change and that command; only the code stage changed, the record's
    dependency checks stand and the code stage, which is Dockerfile.cpu's, is checked here in the CPU
    image built from this tree: `lmi-server config` plans the GPU deployment (the CPU image's other
    tests run the rest of that stage; the refusal of vLLM's CUDA build without a GPU is
    tests/unit/test_host_requirements.py's).
    """
    inputs = gpu_record.gpu_image_inputs()
    if os.environ.get("LMI_BUILD_GPU_IMAGE") == "1":
        build_and_record_gpu_image(inputs, tmp_path)
    verified = gpu_record.read()
    verdict = gpu_record.judge(verified, inputs, code_stage_is_cpu_images=gpu_record.code_stage_shared())
    if verdict.failure:
        pytest.fail(verdict.failure, pytrace=False)
    assert verified["base"].startswith("lmi-standin/vllm-openai:v0.32.0")
    if verdict.current:
        return
    plan = config_check(request.getfixturevalue("cpu_image"), tmp_path)
    warnings.warn(f"{verdict.note} In the CPU image: {plan}.", stacklevel=1)
