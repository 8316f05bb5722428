"""Deploy an image with the SageMaker Python SDK's local mode and call it as SDK users do; print one
JSON document of what came back. Run by tests/e2e/test_sagemaker_sdk.py with the SDK's own
virtual environment (.venv-sagemaker, `make sagemaker-client`): the SDK pins packages that the
server's environment cannot share.

    python sagemaker_local.py IMAGE MODEL_DIR PORT WORKDIR

Local mode writes a docker-compose file (the model archive unpacked at /opt/ml/model, `serve`, the
serving port published from 8080), starts it, waits for /ping and sends `/invocations`. Nothing
here sets a shared-memory size: SageMaker hosting has no such setting. The one change to the SDK's
compose file is the network (see compose_on_host_network): this Docker daemon has no bridge.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SHIM = '''#!{python}
"""docker-compose as the SageMaker SDK calls it, on the host's network: the daemon has no bridge."""
import os, sys, yaml
args = sys.argv[1:]
if "-f" in args:
    path = args[args.index("-f") + 1]
    doc = yaml.safe_load(open(path))
    doc.pop("networks", None)
    for service in doc.get("services", {{}}).values():
        service.pop("networks", None)
        service.pop("ports", None)  # on the host's network the container's port is the host's
        service["network_mode"] = "host"
    open(path, "w").write(yaml.safe_dump(doc))
os.execv("{compose}", ["docker-compose", *args])
'''


def compose_on_host_network(bin_dir: Path) -> None:
    """A `docker-compose` first on PATH that moves the SDK's services from its bridge network
    (`sagemaker-local`) to the host's network, then runs Debian's docker-compose unchanged."""
    compose = next(p for p in ("/usr/bin/docker-compose", "/usr/local/bin/docker-compose") if os.path.exists(p))
    shim = bin_dir / "docker-compose"
    shim.write_text(SHIM.format(python=sys.executable, compose=compose))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def archive(model_dir: Path, out: Path) -> Path:
    """model.tar.gz as SageMaker takes it: the directory's contents at the archive's root."""
    with tarfile.open(out, "w:gz") as tar:
        for child in sorted(model_dir.iterdir()):
            tar.add(child, arcname=child.name)
    return out


def main() -> int:
    image, model_dir, port, work = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    compose_on_host_network(Path(tempfile.mkdtemp(prefix="sm-bin-")))

    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.local import LocalSession
    from sagemaker.model import Model
    from sagemaker.serializers import JSONSerializer

    session = LocalSession()
    session.config = {"local": {"local_code": True, "serving_port": port, "container_root": str(work)}}
    model = Model(
        image_uri=image,
        model_data=f"file://{archive(model_dir, work / 'model.tar.gz')}",
        role="arn:aws:iam::111111111111:role/local-mode",
        env={"SAGEMAKER_BIND_TO_PORT": str(port), "OPTION_MAX_MODEL_LEN": "1024"},
        sagemaker_session=session,
    )
    out: dict = {}
    t0 = time.monotonic()
    predictor = model.deploy(initial_instance_count=1, instance_type="local",
                             serializer=JSONSerializer(), deserializer=JSONDeserializer())
    out["in_service_s"] = round(time.monotonic() - t0, 1)
    try:
        greedy = {"max_new_tokens": 12, "do_sample": False}
        out["lmi"] = predictor.predict({"inputs": "What is the capital of France?", "parameters": greedy})
        out["chat"] = predictor.predict({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                                         "max_tokens": 12, "temperature": 0})
        out["batch"] = predictor.predict({"inputs": ["def add(a, b):", "The capital of France is"], "parameters": greedy})
        out["adapter"] = predictor.predict({"inputs": "def add(a, b):", "adapters": "shouter", "parameters": greedy})
        out["base_for_adapter"] = predictor.predict({"inputs": "def add(a, b):", "parameters": greedy})

        runtime = session.sagemaker_runtime_client
        streamed = runtime.invoke_endpoint(
            Body=json.dumps({"inputs": "def add(a, b):", "parameters": {"max_new_tokens": 16, "do_sample": False},
                             "stream": True}),
            EndpointName=predictor.endpoint_name, ContentType="application/json", Accept="application/jsonlines",
        )["Body"]
        chunks = [chunk.decode() for chunk in streamed.stream(amt=None, decode_content=True)]
        out["stream"] = {"status": streamed.status, "content_type": streamed.headers.get("Content-Type"),
                         "chunks": len(chunks), "text": "".join(chunks)}

        bad = runtime.invoke_endpoint(Body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": -1}}),
                                      EndpointName=predictor.endpoint_name, ContentType="application/json")["Body"]
        out["bad"] = {"status": bad.status, "body": bad.read().decode()[:500]}
    finally:
        predictor.delete_endpoint()
    print("SAGEMAKER_LOCAL_RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
