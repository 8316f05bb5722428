"""The concurrent fuzzer of valid requests, run long over every engine configuration the README
offers, one server at a time; the figures go to benchmarks/results/fuzz_valid.json.

    python scripts/fuzz_valid.py [--seconds 180] [--seed 0] [--only base,lora] [--out FILE]

(`make fuzz`; LMI_FUZZ_SECONDS and LMI_FUZZ_SEED are the defaults of --seconds and --seed.)
Each configuration: the server is started as `lmi-server serve` with its properties, fuzzed for
the budget (batches of 1, 2, 4 and 8 valid requests, tests/support/valid_fuzz.py), then stopped.
A configuration whose server does not start is recorded with the reason. Exit code 1 when any
configuration had an engine death, a 5xx, a hang, an answer from another model, an exception of the
fuzzer itself, or fewer batches than --min-batches; the smallest failing batch is printed as a
script that sends it again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.fuzz_runner import fuzz  # noqa: E402
from tests.support.server import DEMO_PROPS, running_server  # noqa: E402
from tests.support.valid_fuzz import Target  # noqa: E402

TOOLS = {
    "option.enable_auto_tool_choice": "true",
    "option.tool_call_parser": "pythonic",
    "option.structured_outputs_config": '{"backend": "xgrammar", "disable_any_whitespace": true}',
}
LMCACHE_YAML = "chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n"


def _demo_adapters(model_dir: Path) -> None:
    root = model_dir / "adapters"
    root.mkdir(exist_ok=True)
    for name in ("hello-printer", "shouter"):
        shutil.copytree(REPO / "adapters" / name, root / name, dirs_exist_ok=True)
    shutil.copytree(REPO / "adapters" / "hello-printer", root / "hello-copy", dirs_exist_ok=True)  # a third adapter


def _lmcache_file(model_dir: Path, disk: bool = False) -> None:
    text = LMCACHE_YAML
    if disk:
        (model_dir / "disk").mkdir(exist_ok=True)
        text += f'local_disk: "file://{model_dir / "disk"}"\nmax_local_disk_size: 2\nextra_config:\n  use_odirect: true\n'
    (model_dir / "lmcache.yaml").write_text(text)


def _demo_dir() -> str:
    from lmi_server.demo.builder import ensure_demo_model

    return str(ensure_demo_model())


ADAPTERS = ("hello-printer", "shouter", "hello-copy")
ROUTES = frozenset({"/invocations", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"})
"""Every door of a generating model: a configuration's run goes on until each was sent."""
# name -> (properties, files to prepare in the model directory, what the fuzzer may send)
CONFIGURATIONS = {
    "base": (lambda d: {**DEMO_PROPS, **TOOLS}, None, dict(model="lmi-demo", tools=True)),
    "lora": (
        lambda d: {**DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8"},
        _demo_adapters,
        dict(model="lmi-demo", adapters=ADAPTERS, upper_case_adapters=("shouter",)),
    ),
    # more adapters in use than max_loras: one slot for three, few sequences, the fair scheduler on
    "lora-over": (
        lambda d: {**DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "1", "option.max_lora_rank": "8",
                   "option.max_num_seqs": "4"},
        _demo_adapters,
        dict(model="lmi-demo", adapters=ADAPTERS, upper_case_adapters=("shouter",)),
    ),
    # vLLM's own scheduler and FIFO admission, many sequences
    "lora-fifo": (
        lambda d: {**DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8",
                   "option.max_num_seqs": "64", "option.admission_policy": "fifo", "option.tenant_prefill_step": "false"},
        _demo_adapters,
        dict(model="lmi-demo", adapters=ADAPTERS, upper_case_adapters=("shouter",)),
    ),
    # adapters beside LMCache's CPU and disk tiers (vLLM's prefix cache off: every hit is LMCache's)
    "lora-lmcache": (
        lambda d: {**DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8",
                   "option.enable_prefix_caching": "false", "option.lmcache_config_file": "lmcache.yaml"},
        lambda d: (_demo_adapters(d), _lmcache_file(d, disk=True)),
        dict(model="lmi-demo", adapters=ADAPTERS, upper_case_adapters=("shouter",)),
    ),
    "assistant-lora": (
        lambda d: {"option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "16",
                   "option.cpu_kv_cache_space": "1"},
        None,
        dict(model="smollm2-135m-instruct", adapters=("pirate", "shouter"), upper_case_adapters=("shouter",), tools=True,
             max_model_len=8192),
    ),
    "lmcache-auto": (lambda d: {**DEMO_PROPS, "option.lmcache_auto_config": "true"}, None, dict(model="lmi-demo")),
    "lmcache-file": (
        lambda d: {**DEMO_PROPS, "option.enable_prefix_caching": "false", "option.lmcache_config_file": "lmcache.yaml"},
        lambda d: _lmcache_file(d, disk=True),
        dict(model="lmi-demo"),
    ),
    "blend": (
        lambda d: {**DEMO_PROPS, "option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true"},
        _lmcache_file,
        dict(model="lmi-demo"),
    ),
    "eagle": (lambda d: {**DEMO_PROPS, "option.speculative_method": "eagle", "option.num_speculative_tokens": "3"}, None,
              dict(model="lmi-demo", greedy=True)),
    "eagle3": (lambda d: {"option.speculative_method": "eagle3", "option.cpu_kv_cache_space": "1"}, None,
               dict(model="smollm2-135m-instruct", tools=True, max_model_len=8192, greedy=True)),
    "ngram": (lambda d: {**DEMO_PROPS, "option.speculative_method": "ngram"}, None, dict(model="lmi-demo", greedy=True)),
    "draft-model": (
        lambda d: {**DEMO_PROPS, "option.speculative_method": "draft_model", "option.speculative_draft_model": _demo_dir(),
                   "option.num_speculative_tokens": "2"},
        None,
        dict(model="lmi-demo", greedy=True),
    ),
    "vision": (lambda d: {"option.model_id": "tiny-qwen2-vl-shapes", "option.cpu_kv_cache_space": "1"}, None,
               dict(model="tiny-qwen2-vl-shapes", vision=True)),
    "embedding": (lambda d: {"option.model_id": "all-minilm-l6-v2", "option.cpu_kv_cache_space": "1",
                             "option.max_request_bytes": "200000"}, None,
                  dict(model="all-minilm-l6-v2", kind="embed", max_model_len=256, sessions=False)),
}
NOT_OFFERED = {"mtp": "no built-in model has multi-token-prediction layers (option.speculative_method=mtp needs one)"}


def max_model_len(base_url: str, model: str, default: int) -> int:
    import httpx

    for card in httpx.get(base_url + "/v1/models", timeout=30).json().get("data", []):
        if card.get("id") == model and card.get("max_model_len"):
            return int(card["max_model_len"])
    return default


def run_configuration(name: str, seconds: float, seed: int, log, logs: Path, min_batches: int = 0) -> dict:
    props_of, prepare, what = CONFIGURATIONS[name]
    model_dir = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    started = time.monotonic()
    stage = "start_failed"
    try:
        if prepare is not None:
            prepare(model_dir)
        with running_server(model_dir, props_of(model_dir)) as server:
            stage = "error"
            start_s = time.monotonic() - started
            log(f"[{name}] ready after {start_s:.0f} s; fuzzing for {seconds:.0f} s")
            what = dict(what)
            what["max_model_len"] = max_model_len(server.base_url, what["model"], what.get("max_model_len", 4096))
            stats = fuzz(Target(name, server.base_url, **what), seconds, seed=seed, shrink_seconds=min(600.0, seconds), log=log,
                         min_batches=min_batches, routes=ROUTES if what.get("kind", "generate") == "generate" else frozenset())
            result = stats.as_json()
            result["failed"] = stats.failed()
            if stats.reproducer:
                log(f"[{name}] smallest failing batch (BASE = {server.base_url!r}):\n{stats.reproducer_text()}")
            result["start_s"] = round(start_s, 1)
            alive = server.proc.poll() is None
        result["server_alive_at_end"] = alive
        return result
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot start (or be fuzzed) is recorded, the others run
        return {"configuration": name, stage: f"{type(exc).__name__}: {str(exc)[-1500:]}"}
    finally:
        if (model_dir / "server.log").is_file():  # the engine's tracebacks, for what the figures report
            logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(model_dir / "server.log", logs / f"{name}.log")
        shutil.rmtree(model_dir, ignore_errors=True)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("LMI_FUZZ_SECONDS", "180")),
                        help="fuzzing time per configuration (default: LMI_FUZZ_SECONDS or 180)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("LMI_FUZZ_SEED", "0")))
    parser.add_argument("--min-batches", type=int, default=int(os.environ.get("LMI_FUZZ_MIN_BATCHES", "20")),
                        help="batches each configuration must run for its verdict (past the budget if need be; default 20)")
    parser.add_argument("--only", default="", help="comma-separated configurations (default: all): " + ", ".join(CONFIGURATIONS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fuzz_valid.json")
    parser.add_argument("--logs", type=Path, default=None, help="where the servers' logs are kept (default: a new temporary folder)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CONFIGURATIONS)
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGURATIONS)}")

    def log(line: str) -> None:
        print(line, flush=True)

    logs = args.logs or Path(tempfile.mkdtemp(prefix="fuzz-logs-"))
    log(f"server logs in {logs}")
    began = time.monotonic()
    results = []
    for name in names:
        result = run_configuration(name, args.seconds, args.seed, log, logs, args.min_batches)
        summary = {k: result.get(k) for k in ("batches", "requests_sent", "combinations_tried", "engine_deaths",
                                              "server_errors_5xx", "hangs", "wrong_model", "start_failed", "error")}
        log(f"[{name}] {json.dumps(summary)}")
        results.append(result)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_report(results, args, began), indent=1) + "\n")  # kept after each configuration
    report = _report(results, args, began)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    log(json.dumps(report["totals"]))
    return 1 if report["totals"]["failed_configurations"] else 0


def _report(results: list[dict], args, began: float) -> dict:
    ran = [r for r in results if "start_failed" not in r and "error" not in r]
    totals = {key: sum(r.get(key, 0) for r in ran) for key in
              ("batches", "requests_sent", "combinations_tried", "engine_deaths", "server_errors_5xx", "hangs", "wrong_model")}
    totals["harness_errors"] = sum(len(r.get("harness_errors") or []) for r in ran)
    routes: dict[str, int] = {}
    for r in ran:
        for route, n in (r.get("requests_by_route") or {}).items():
            routes[route] = routes.get(route, 0) + n
    totals["requests_by_route"] = dict(sorted(routes.items()))
    totals["fuzzing_minutes"] = round(sum(r.get("seconds", 0) for r in ran) / 60, 1)
    totals["wall_minutes"] = round((time.monotonic() - began) / 60, 1)
    totals["configurations"] = len(results)
    totals["failed_configurations"] = [
        r["configuration"] for r in results
        if "start_failed" in r or "error" in r or r.get("failed")
    ]
    return {
        "what": "concurrent fuzzer of valid requests (scripts/fuzz_valid.py): batches of 1, 2, 4, 8",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "seed": args.seed,
        "seconds_per_configuration": args.seconds,
        "not_offered": NOT_OFFERED,
        "totals": totals,
        "configurations": results,
    }


if __name__ == "__main__":
    sys.exit(main())
