#!/usr/bin/env python
"""Serve the tiny Qwen2-VL (lmi_server/demo/vlm) with vLLM's own OpenAI server and ask it about
held-out pictures (drawn from scripts/train_tiny_vlm.py's held-out stream, never trained on) through
/v1/chat/completions with image_url data: URLs.

    flock /tmp/lmi-bench.lock .venv/bin/python scripts/check_tiny_vlm_vllm.py \
        --model lmi_server/demo/vlm --out benchmarks/results/tiny_vlm_vllm.json

Without a usable torchvision, transformers cannot build Qwen2-VL's processor (its video processor
needs torchvision); the server is then started with a sitecustomize that calls
lmi_server.demo.vision.allow_image_only_processors() in each of vLLM's processes (the API server
and the engine core it spawns). --no-shim starts it plainly, to show what happens without.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_tiny_vlm.py"


def load_trainer():
    spec = importlib.util.spec_from_file_location("train_tiny_vlm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny_vlm"] = mod
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base: str, proc: subprocess.Popen, limit: float) -> float:
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"server not ready after {limit:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "lmi_server/demo/vlm"))
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/tiny_vlm_vllm.json"))
    ap.add_argument("--pictures", type=int, default=24, help="held-out pictures asked (each: colour, shape, describe)")
    ap.add_argument("--seed", type=int, default=20261203, help="the trainer's --seed (its held-out stream)")
    ap.add_argument("--n-train", type=int, default=6000, help="the trainer's --n-train (to rebuild the split)")
    ap.add_argument("--no-shim", action="store_true")
    ap.add_argument("--ready-timeout", type=float, default=420)
    args = ap.parse_args()

    tv = load_trainer()
    _, held = tv.make_split(args.seed, args.n_train, args.pictures)
    # the first picture asked is a red circle from the held-out stream, for the headline request
    red_circle = next((f for f in tv.make_split(args.seed, args.n_train, 400)[1] if (f.colour, f.shape) == ("red", "circle")), None)

    port = free_port()
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    shim_dir = None
    if not args.no_shim:
        shim_dir = tempfile.mkdtemp(prefix="vlm-shim-")
        Path(shim_dir, "sitecustomize.py").write_text(
            "from lmi_server.demo.vision import allow_image_only_processors\nallow_image_only_processors()\n"
        )
        env["PYTHONPATH"] = os.pathsep.join([shim_dir, str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model, "--served-model-name", "tiny-vlm",
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
        "--limit-mm-per-prompt", json.dumps({"image": 1, "video": 0}),
        "--max-num-seqs", "8",
    ]
    log_path = Path(tempfile.mkdtemp(prefix="vlm-vllm-")) / "server.log"
    print("starting:", " ".join(cmd), "log:", log_path, flush=True)
    logf = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    result: dict = {"command": cmd, "env": {"VLLM_CPU_KVCACHE_SPACE": env["VLLM_CPU_KVCACHE_SPACE"]}, "shim": not args.no_shim}
    try:
        try:
            result["ready_seconds"] = round(wait_ready(base, proc, args.ready_timeout), 1)
        except Exception as exc:
            logf.flush()
            tail = log_path.read_text().splitlines()[-40:]
            result["error"] = str(exc)
            result["log_tail"] = tail
            print("\n".join(tail))
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
            return 1

        def ask(img, question: str) -> tuple[dict, str]:
            body = {
                "model": "tiny-vlm",
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url(img)}},
                    {"type": "text", "text": question},
                ]}],
                "max_tokens": 8,
                "temperature": 0,
            }
            resp = post(base + "/v1/chat/completions", body)
            return body, resp["choices"][0]["message"]["content"].strip()

        if red_circle is not None:
            body, colour = ask(tv.draw(red_circle), "What colour is the shape?")
            _, shape = ask(tv.draw(red_circle), "What shape is it?")
            _, desc = ask(tv.draw(red_circle), "Describe the figure.")
            short = dict(body)
            short["messages"] = [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": body["messages"][0]["content"][0]["image_url"]["url"][:40] + "..."}},
                body["messages"][0]["content"][1],
            ]}]
            result["red_circle"] = {"figure": red_circle.__dict__, "request": short,
                                    "answers": {"What colour is the shape?": colour, "What shape is it?": shape, "Describe the figure.": desc}}
            print("red circle:", result["red_circle"]["answers"], flush=True)

        rng = random.Random(args.seed + 5)
        per_kind = {k: [0, 0] for k in tv.KINDS}
        rows = []
        t0 = time.time()
        for f in held:
            img = tv.draw(f)
            for kind in tv.KINDS:
                q = rng.choice(tv.QUESTIONS[kind])
                _, got = ask(img, q)
                want = tv.answer(f, kind)
                per_kind[kind][0] += got == want
                per_kind[kind][1] += 1
                rows.append({"question": q, "answer": got, "expected": want})
        result["held_out"] = {k: {"correct": c, "total": n, "accuracy": round(c / n, 4)} for k, (c, n) in per_kind.items()}
        result["requests"] = len(rows)
        result["seconds"] = round(time.time() - t0, 1)
        result["examples"] = rows[:9]
        print("held-out through vLLM:", result["held_out"], flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()
    result["log_notes"] = [l for l in log_path.read_text().splitlines()
                           if any(w in l for w in ("attention backend", "Using", "WARNING", "mrope", "MRoPE"))][:30]
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
