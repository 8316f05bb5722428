"""A small stand-in for LMI's `awscurl` load tool, as LMI's integration client calls it.

The client runs `./awscurl -c C -N N -X POST URL [-H 'k: v']... (-d JSON | --dataset DIR)
[--delay ...] [--json-path F] [-j Q] [-P] [-t] [-o F]` and only checks that the printed summary
does not say `error rate: 100`. This sends C concurrent clients x N requests (each dataset file in
turn), counts the answers that are not 2xx or that carry an error, and prints that summary.
Plain HTTP, no AWS signing: the server under test is on loopback.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time

import httpx


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("-c", type=int, default=1)
    p.add_argument("-N", type=int, default=1)
    p.add_argument("-X", default="POST")
    p.add_argument("-H", action="append", default=[])
    p.add_argument("-d")
    p.add_argument("--dataset")
    p.add_argument("--delay")
    p.add_argument("--json-path")
    p.add_argument("--connect-timeout", type=float, default=300)
    p.add_argument("-j")
    p.add_argument("-o")
    p.add_argument("-P", action="store_true")
    p.add_argument("-t", action="store_true")
    p.add_argument("url", nargs="?")
    return p.parse_args(argv)


def _failed(response: httpx.Response) -> bool:
    if response.status_code >= 300:
        return True
    for line in response.text.splitlines():
        line = line.strip().removeprefix("data:").strip()
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        details = item.get("details") if isinstance(item, dict) else None
        if (isinstance(details, dict) and details.get("finish_reason") == "error") or (isinstance(item, dict) and "error" in item):
            return True
    return False


def main(argv: list[str]) -> int:
    try:
        args = _parse(argv)
    except SystemExit:
        print("awscurl stand-in: the command line could not be read: " + " ".join(argv)[:200])
        return 2
    if args.help or not args.url:
        print("awscurl stand-in: -c C -N N -X POST URL -H 'k: v' (-d JSON | --dataset DIR)")
        return 0
    if args.dataset:
        names = sorted(os.listdir(args.dataset))
        bodies = [open(os.path.join(args.dataset, n), encoding="utf-8").read() for n in names]
    else:
        bodies = [args.d or "{}"]
    headers = dict(h.split(":", 1) for h in args.H)
    headers = {k.strip(): v.strip() for k, v in headers.items()}

    def client(worker: int) -> tuple[int, int, float]:
        errors = 0
        started = time.monotonic()
        with httpx.Client(timeout=httpx.Timeout(600, connect=args.connect_timeout)) as http:
            for i in range(args.N):
                body = bodies[(worker + i) % len(bodies)]
                try:
                    errors += _failed(http.request(args.X, args.url, content=body.encode(), headers=headers))
                except httpx.HTTPError:
                    errors += 1
        return errors, args.N, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(args.c) as pool:
        results = list(pool.map(client, range(args.c)))
    errors = sum(r[0] for r in results)
    total = sum(r[1] for r in results)
    rate = 100.0 * errors / max(total, 1)
    print(f"Total requests: {total}, concurrency: {args.c}, error rate: {rate:g}, "
          f"time: {max(r[2] for r in results):.2f} s")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"requests": total, "errors": errors, "error_rate": rate}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
