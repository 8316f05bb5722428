"""Run LMI's own LLM integration client (djl-serving `tests/integration/llm/client.py`) against
this server, the way LMI's CI runs it against its container.

    python scripts/lmi_client/run.py --client PATH/TO/client.py [--start] [--out FILE]

The client is read from an LMI checkout (it is LMI's, not part of this project); it talks to
127.0.0.1:8080 and calls `./awscurl`, for which `awscurl.py` beside this file stands in. With
`--start` the server is started here on port 8080 on the embedded assistant with its example
adapters (`pirate`, `shouter`; option.max_lora_rank=16, option.max_loras=2). Cases (the model-independent
ones of LMI's vLLM suite): `vllm`, `vllm_neo` and `no_code` (rolling batch, streaming and not),
`vllm_chat`, `vllm_tool` (chat with tools), `stateful`, `vllm_async_adapters`,
`vllm_async_adapters_chat`, and `vllm_prefill`: LMI's rolling-batch case with the parameters of its
`decoder_input_details` specs (mistral-7b, qwen2-7b-fp8: batch 1 and 4, not streamed) on the first
adapter, so that prompt log-probabilities run beside each other. The adapter cases delete their first adapter at
the end; it is registered again before the next case (LMI's CI starts a fresh container per case).
Writes a JSON record of each case: passed or the exception, and how long it took.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
BASE = "http://127.0.0.1:8080"
MODEL = "lmi-server-assistant"
ADAPTERS = ["pirate", "shouter"]
CASES = ["vllm", "vllm_neo", "no_code", "vllm_chat", "vllm_tool", "stateful", "vllm_async_adapters", "vllm_async_adapters_chat",
         "vllm_prefill"]
SPEC = {"batch_size": [1, 2], "seq_length": [16], "stream": [False, True]}
PREFILL_MODEL = MODEL + "-prefill"  # the client picks a case's spec by model name
PREFILL_SPEC = {"batch_size": [1, 4], "seq_length": [16], "stream": [False], "parameters": {"decoder_input_details": True}}
CASE_ARGS = {"vllm_prefill": ["vllm", PREFILL_MODEL]}  # (handler, model) where the case is not the handler's name


def load_client(path: Path):
    spec = importlib.util.spec_from_file_location("lmi_integration_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.vllm_model_spec[MODEL] = {**SPEC, "adapters": ADAPTERS}
    module.vllm_model_spec[PREFILL_MODEL] = {**PREFILL_SPEC, "adapters": ADAPTERS}
    for table in ("vllm_neo_model_spec", "no_code_rolling_batch_spec", "vllm_chat_model_spec", "vllm_tool_model_spec",
                  "stateful_model_spec"):
        getattr(module, table)[MODEL] = dict(SPEC)
    return module


@contextlib.contextmanager
def server(log_path: Path):
    model_dir = Path(tempfile.mkdtemp(prefix="lmi-client-model-"))
    env = {**os.environ, "OPTION_ENABLE_LORA": "true", "OPTION_MAX_LORA_RANK": "16", "OPTION_MAX_LORAS": "2", "PYTHONHASHSEED": "0"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(model_dir), "--port", "8080"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(BASE + "/ping", timeout=5).status_code == 200:
                    break
            time.sleep(2)
        else:
            raise TimeoutError(f"server not ready; see {log_path}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(model_dir, ignore_errors=True)


def restore_adapters() -> None:
    known = {a["name"] for a in httpx.get(BASE + "/adapters", timeout=30).json()["adapters"]}
    for name in ADAPTERS:
        if name not in known:
            src = Path(__file__).resolve().parents[2] / "lmi_server" / "demo" / "assistant" / "adapters" / name
            r = httpx.post(BASE + "/adapters", json={"name": name, "src": str(src)}, timeout=120)
            if r.status_code >= 300:
                raise RuntimeError(f"could not register {name} again: {r.status_code} {r.text}")


def run_cases(client, cases: list[str], workdir: Path) -> list[dict]:
    awscurl = workdir / "awscurl"
    awscurl.write_text(f"#!{sys.executable}\n" + (HERE / "awscurl.py").read_text())
    awscurl.chmod(0o755)
    os.chdir(workdir)
    results = []
    for case in cases:
        restore_adapters()
        started = time.monotonic()
        try:
            client.run(CASE_ARGS.get(case, [case, MODEL]))
            outcome = {"case": case, "passed": True}
        except BaseException as exc:  # noqa: BLE001 - the client asserts and raises freely
            outcome = {"case": case, "passed": False, "error": f"{type(exc).__name__}: {exc}",
                       "where": traceback.format_exc().splitlines()[-3:]}
        outcome["seconds"] = round(time.monotonic() - started, 1)
        print(json.dumps(outcome), flush=True)
        results.append(outcome)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", type=Path, required=True, help="djl-serving's tests/integration/llm/client.py")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--start", action="store_true", help="start the server on port 8080 first")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lmi_client.json"))
    args = parser.parse_args()
    out = args.out.resolve()
    client = load_client(args.client.resolve())
    workdir = Path(tempfile.mkdtemp(prefix="lmi-client-"))
    with (server(workdir / "server.log") if args.start else contextlib.nullcontext()):
        results = run_cases(client, [c for c in args.cases.split(",") if c], workdir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": MODEL, "adapters": ADAPTERS, "spec": SPEC, "prefill_spec": PREFILL_SPEC,
                               "cases": results}, indent=2) + "\n")
    print(f"{sum(r['passed'] for r in results)} of {len(results)} cases passed; {out}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
