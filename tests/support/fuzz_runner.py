"""Sends the valid-request fuzzer's batches to a running server and judges the answers.

A batch's requests go out at once (one thread each). Failures: a 5xx (a status, or an error event
in a stream that had started), a request unanswered within its timeout (a hang), an answer from
another model than the one named (the `model` field; the upper-casing formatter of an adapter
that has one), and the engine's death (/ping not 200 after the batch). A 4xx is a refusal, allowed
and counted by its message. Hypothesis drives the batches (`fuzz`): seeded, stopped when the time
budget is spent; a failure is shrunk within a time bound, and the smallest failing batch seen is
kept in the figures whether or not shrinking finished.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.valid_fuzz import PROMPT_UNIT, SESSION_HEADER, Case, Target, batches

MAX_FAILURES_KEPT = 10


class BudgetSpent(BaseException):
    """Ends hypothesis' run when the time budget is spent (a BaseException: hypothesis does not
    take it for a failure to shrink)."""


class ServerGone(BaseException):
    """The server stopped answering at all (its process ended, or its engine never came back)."""


@dataclass
class Outcome:
    case: Case
    status: int | str  # HTTP status, "hang" or "error"
    seconds: float
    problems: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class Stats:
    """The figures of one configuration's run."""

    configuration: str
    seconds: float = 0.0
    batches: int = 0
    requests: int = 0
    combinations: set[str] = field(default_factory=set)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    routes: collections.Counter = field(default_factory=collections.Counter)
    refusals: collections.Counter = field(default_factory=collections.Counter)
    engine_deaths: int = 0
    server_errors: int = 0
    hangs: int = 0
    wrong_model: int = 0
    failures: list[dict] = field(default_factory=list)
    smallest_failure: list[dict] | None = None
    reproducer: list[dict] | None = None
    """The smallest failing batch in full (bodies not shortened): what to send again."""
    harness_errors: list[str] = field(default_factory=list)
    """Exceptions of the fuzzer itself (a strategy, the runner): each fails the run."""
    min_batches: int = 0
    required_routes: frozenset = frozenset()
    """Routes that must each have been sent at least once for a verdict."""
    stopped: str = "budget"
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def failed(self) -> bool:
        return bool(self.engine_deaths or self.server_errors or self.hangs or self.wrong_model or self.failures
                    or self.harness_errors or not self.enough() or self.stopped.startswith("server gone"))

    def enough(self) -> bool:
        """Enough batches, and every required route sent: the run may judge."""
        return self.batches >= self.min_batches and set(self.routes) >= self.required_routes

    def reproducer_text(self) -> str:
        """The smallest failing batch as a script to paste: its requests sent at once."""
        if not self.reproducer:
            return ""
        return ("# sent at once (one thread each) to the server under test:\nimport httpx, json, concurrent.futures as f\n"
                f"BATCH = json.loads({json.dumps(json.dumps(self.reproducer))})\n"
                "def send(c):\n    return httpx.post(BASE + c['route'], json=c['body'], headers=c['headers'], timeout=300).status_code\n"
                "print(list(f.ThreadPoolExecutor(len(BATCH)).map(send, BATCH)))\n")

    def as_json(self) -> dict[str, Any]:
        return {
            "configuration": self.configuration,
            "seconds": round(self.seconds, 1),
            "batches": self.batches,
            "requests_sent": self.requests,
            "combinations_tried": len(self.combinations),
            "requests_by_route": dict(sorted(self.routes.items())),
            "engine_deaths": self.engine_deaths,
            "server_errors_5xx": self.server_errors,
            "hangs": self.hangs,
            "wrong_model": self.wrong_model,
            "statuses": dict(sorted((str(k), v) for k, v in self.statuses.items())),
            "refusals": dict(self.refusals.most_common(15)),
            "stopped": self.stopped,
            "min_batches": self.min_batches,
            "routes_never_sent": sorted(self.required_routes - set(self.routes)),
            "harness_errors": self.harness_errors,
            "failures": self.failures,
            "smallest_failure": self.smallest_failure,
            "reproducer": self.reproducer,
        }


def _shorten(value: Any) -> Any:
    """Long prompts shortened for the record (near-limit prompts are thousands of characters)."""
    if isinstance(value, str) and len(value) > 160:
        return value[:120] + f"...({len(value)} chars)"
    if isinstance(value, dict):
        return {k: _shorten(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    return value


def _describe(case: Case) -> dict[str, Any]:
    return {"route": case.route, "body": _shorten(case.body), "headers": case.headers, "session": case.session,
            "session_cycle": case.session_cycle}


# ---------------------------------------------------------------------------- judging one answer


def _json_objects(text: str) -> list[Any]:
    """Every JSON value in a body: the whole of it, else each SSE `data:` or jsonlines line."""
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line or line == "[DONE]":
            continue
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def _stream_error(obj: Any) -> int | None:
    """The status of an error object that ended a stream (OpenAI envelope or LMI's flat one)."""
    if isinstance(obj, dict) and obj.get("type") == "response.failed":  # a Responses stream that failed
        return 500
    if isinstance(obj, dict) and obj.get("type") == "error" and "error" not in obj:  # a Responses error event
        try:
            return int(obj.get("code"))
        except (TypeError, ValueError):
            return 500
    if not isinstance(obj, dict) or "error" not in obj or "choices" in obj:
        if isinstance(obj, dict) and isinstance(obj.get("details"), dict) and obj["details"].get("finish_reason") == "error":
            return 500
        return None
    err = obj["error"]
    code = err.get("code") if isinstance(err, dict) else obj.get("code")
    try:
        return int(code)
    except (TypeError, ValueError):
        return 500


def _texts(obj: Any, case: Case) -> list[str]:
    """The answer's generated texts, where an upper-casing adapter must show (not echoed prompts,
    not LMI's return_full_text, not tool calls)."""
    body = case.body if isinstance(case.body, dict) else {}
    if body.get("echo") or (body.get("parameters") or {}).get("return_full_text"):
        return []
    out: list[str] = []
    items = obj if isinstance(obj, list) else [obj]
    for item in items:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("generated_text"), str):
            out.append(item["generated_text"])
        for choice in item.get("choices") or []:
            if isinstance(choice, dict):
                text = choice.get("text") or (choice.get("message") or {}).get("content")
                if isinstance(text, str) and "delta" not in choice:
                    out.append(text)
        if item.get("object") == "response":  # Responses: the message items' output_text parts
            out += [p.get("text") or "" for o in item.get("output") or [] if isinstance(o, dict) and o.get("type") == "message"
                    for p in o.get("content") or [] if isinstance(p, dict) and p.get("type") == "output_text"]
        if item.get("type") == "message" and isinstance(item.get("content"), list):  # Anthropic Messages
            out += [b.get("text") or "" for b in item["content"] if isinstance(b, dict) and b.get("type") == "text"]
    deltas = [item.get("delta") for item in items if isinstance(item, dict) and item.get("type") == "response.output_text.delta"]
    deltas += [item["delta"].get("text") for item in items if isinstance(item, dict) and item.get("type") == "content_block_delta"
               and isinstance(item.get("delta"), dict) and item["delta"].get("type") == "text_delta"]
    if deltas:  # a Responses or Messages stream: the text it sent
        out.append("".join(d for d in deltas if isinstance(d, str)))
    return out


def judge(case: Case, status: int, text: str) -> tuple[list[str], str]:
    """Problems with one answer (empty: fine), and the refusal's key for a 4xx."""
    problems: list[str] = []
    if status >= 500:
        return [f"{status}: {text[:300]}"], ""
    objects = _json_objects(text)
    if 400 <= status < 500:
        message = objects[0].get("error") if objects and isinstance(objects[0], dict) else text
        message = message.get("message", "") if isinstance(message, dict) else str(message)
        if status == 424 and case.adapter is not None and "Custom formatter failed" in message:
            # the fuzzed adapters' formatters work: their failure on a valid request is the server's
            return [f"{status}: the formatter of {case.adapter!r} failed on {case.route}: {message[:300]}"], ""
        return [], f"{status} {case.route}: {message[:90]}"
    for obj in objects:
        code = _stream_error(obj)
        if code is not None and code >= 500:
            problems.append(f"error event {code} in a {status} answer: {json.dumps(obj)[:300]}")
        if code is not None and code < 500:
            return problems, f"{code} {case.route} (in stream): {json.dumps(obj)[:90]}"
        if case.expect_model and isinstance(obj, dict) and "model" in obj and obj["model"] != case.expect_model:
            problems.append(f"answered by {obj['model']!r}, named {case.expect_model!r}")
    if case.upper_case:
        for t in _texts(objects[0] if len(objects) == 1 else objects, case):
            if t != t.upper():
                problems.append(f"adapter {case.adapter!r} formats its answer upper-case; got {t[:80]!r}")
    return problems, ""


# ---------------------------------------------------------------------------- sending


class Runner:
    """One server's fuzzing: sessions opened once, batches sent and judged, figures kept."""

    def __init__(self, target: Target, stats: Stats, *, request_timeout: float = 120.0, recovery_timeout: float = 300.0):
        self.target = target
        self.stats = stats
        self.request_timeout = request_timeout
        self.recovery_timeout = recovery_timeout
        self.http = httpx.Client(base_url=target.base_url, timeout=httpx.Timeout(request_timeout, connect=10))
        self.sessions: list[str] = []

    def close(self) -> None:
        self.http.close()

    # -- health
    def ping(self) -> int | None:
        try:
            return self.http.get("/ping", timeout=10).status_code
        except httpx.HTTPError:
            return None

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.recovery_timeout
        while time.monotonic() < deadline:
            if self.ping() == 200:
                return
            time.sleep(1)
        raise ServerGone(f"/ping not 200 within {self.recovery_timeout:.0f} s")

    # -- sessions
    def _new_session(self) -> str | None:
        r = self.http.post("/invocations", json={"requestType": "NEW_SESSION"})
        if r.status_code >= 500:
            raise RuntimeError(f"NEW_SESSION: {r.status_code} {r.text[:200]}")
        value = r.headers.get(SESSION_HEADER) if r.status_code == 200 else None
        return value.split(";")[0].strip() if value else None  # "<id>; Expires=<UTC>"

    def open_sessions(self, count: int = 4) -> None:
        if self.target.kind == "generate" and self.target.sessions:
            self.sessions = [s for s in (self._new_session() for _ in range(count)) if s]

    # -- one request
    def _post(self, case: Case, headers: dict[str, str]) -> tuple[int, str]:
        if case.stream:
            with self.http.stream("POST", case.route, json=case.body, headers=headers) as r:
                chunks = []
                deadline = time.monotonic() + self.request_timeout
                for chunk in r.iter_text():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("stream still open past the request timeout")
                return r.status_code, "".join(chunks)
        r = self.http.post(case.route, json=case.body, headers=headers)
        return r.status_code, r.text

    def send(self, case: Case) -> Outcome:
        headers = dict(case.headers)
        started = time.monotonic()
        session = None
        try:
            if case.session_cycle:
                session = self._new_session()
            elif case.session is not None and self.sessions:
                session = self.sessions[case.session % len(self.sessions)]
            if session:
                headers[SESSION_HEADER] = session
            status, text = self._post(case, headers)
            if case.session_cycle and session:
                closed = self.http.post("/invocations", json={"requestType": "CLOSE"}, headers={SESSION_HEADER: session})
                if closed.status_code >= 500:
                    status, text = closed.status_code, "CLOSE: " + closed.text
        except httpx.TimeoutException as exc:
            return Outcome(case, "hang", time.monotonic() - started, [f"no answer within {self.request_timeout:.0f} s: {exc}"])
        except (httpx.HTTPError, RuntimeError) as exc:
            return Outcome(case, "error", time.monotonic() - started, [f"{type(exc).__name__}: {exc}"])
        problems, refusal = judge(case, status, text)
        return Outcome(case, status, time.monotonic() - started, problems, refusal)

    # -- one batch
    def run_batch(self, cases: list[Case]) -> list[Outcome]:
        self.wait_healthy()
        with ThreadPoolExecutor(len(cases)) as pool:
            outcomes = list(pool.map(self.send, cases))
        died = self.ping() != 200
        if died:  # one more look: a draining or loaded server may answer late
            time.sleep(2)
            died = self.ping() != 200
        self._record(cases, outcomes, died)
        return outcomes if not died else outcomes + [Outcome(cases[0], "engine death", 0.0, ["/ping not 200 after the batch"])]

    def _record(self, cases: list[Case], outcomes: list[Outcome], died: bool) -> None:
        s = self.stats
        with s.lock:
            s.batches += 1
            s.requests += len(cases)
            s.combinations.update(c.signature() for c in cases)
            s.routes.update(c.route for c in cases)
            s.engine_deaths += int(died)
            bad = []
            for o in outcomes:
                s.statuses[o.status] += 1
                if o.detail:
                    s.refusals[o.detail] += 1
                if o.status == "hang":
                    s.hangs += 1
                elif o.status == "error" or isinstance(o.status, int) and o.status >= 500 or any(p.startswith("error event") for p in o.problems):
                    s.server_errors += 1
                elif any("answered by" in p or "upper-case" in p for p in o.problems):
                    s.wrong_model += 1
                if o.problems:
                    bad.append({"request": _describe(o.case), "status": o.status, "problems": o.problems})
            if bad or died:
                record = {"batch_size": len(cases), "engine_died": died, "bad": bad,
                          "batch": [_describe(c) for c in cases]}
                if len(s.failures) < MAX_FAILURES_KEPT:
                    s.failures.append(record)
                if s.smallest_failure is None or len(cases) < len(s.smallest_failure):
                    s.smallest_failure = record["batch"]
                    s.reproducer = [{"route": c.route, "body": c.body, "headers": c.headers} for c in cases]


def calibrate(target: Target, http: httpx.Client) -> float:
    """Tokens per PROMPT_UNIT on this server's tokenizer (for prompts near the context limit)."""
    if target.kind != "generate":
        body = {"model": target.model, "input": PROMPT_UNIT * 20}
        r = http.post("/v1/embeddings", json=body)
    else:
        r = http.post("/v1/completions", json={"model": target.model, "prompt": PROMPT_UNIT * 20, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    return max(1.0, r.json()["usage"]["prompt_tokens"] / 20)


class BatchFailed(AssertionError):
    """A batch had a failure (recorded in the figures); hypothesis shrinks on it."""


def fuzz(target: Target, seconds: float, *, seed: int = 0, request_timeout: float = 120.0, shrink_seconds: float = 300.0,
         recovery_timeout: float = 300.0, log: Any = None, min_batches: int = 0,
         routes: frozenset[str] = frozenset()) -> Stats:
    """Batches of valid requests for `seconds` and at least `min_batches` (going on past the
    budget, up to three times it plus a minute, until that many ran), then the figures.
    `routes`: the run also goes on (within the same bound) until each of them was sent at least
    once, and fails if one never was. A failing batch is shrunk by hypothesis for at most `shrink_seconds` more (its report, raised as BatchFailed, is
    taken here: the figures carry every failure and the smallest batch as a reproducer). Any
    other exception is the fuzzer's own: recorded as a harness error, which fails the run."""
    from dataclasses import replace

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    stats = Stats(target.name, min_batches=min_batches, required_routes=frozenset(routes))
    probe = httpx.Client(base_url=target.base_url, timeout=request_timeout)
    try:
        target = replace(target, tokens_per_unit=calibrate(target, probe))
    finally:
        probe.close()
    runner = Runner(target, stats, request_timeout=request_timeout, recovery_timeout=recovery_timeout)
    started = time.monotonic()
    deadline = started + seconds
    shrink_deadline: list[float] = []

    @with_seed(seed)
    @settings(max_examples=10**9, deadline=None, database=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(batch=batches(target))
    def one_batch(batch: list[Case]) -> None:
        now = time.monotonic()
        if shrink_deadline and now > shrink_deadline[0]:
            raise BudgetSpent("shrink")
        if not shrink_deadline and now > deadline and (stats.enough() or now > started + 3 * seconds + 60):
            raise BudgetSpent("budget")
        try:
            outcomes = runner.run_batch(batch)
        except Exception as exc:  # the fuzzer's own failure: recorded where it happens, hypothesis may still shrink it
            import traceback

            if len(stats.harness_errors) < MAX_FAILURES_KEPT:
                stats.harness_errors.append("".join(traceback.format_exception(exc))[-3000:])
            raise
        failed = [o for o in outcomes if o.problems]
        if log is not None and stats.batches % 25 == 0:
            log(f"[{target.name}] {stats.batches} batches, {stats.requests} requests, {time.monotonic() - started:.0f} s")
        if failed:
            if not shrink_deadline:
                shrink_deadline.append(time.monotonic() + shrink_seconds)
            raise BatchFailed("; ".join(p for o in failed for p in o.problems)[:2000])

    try:
        runner.open_sessions()
        one_batch()
    except BudgetSpent as exc:
        stats.stopped = str(exc)
    except ServerGone as exc:
        stats.stopped = f"server gone: {exc}"
    except BatchFailed as exc:  # hypothesis finished shrinking: the figures hold the failures
        stats.stopped = f"failure: {str(exc)[:500]}"
    except Exception as exc:  # noqa: BLE001 - the fuzzer's own failure (or hypothesis' flaky verdict on ours)
        import traceback

        if not stats.failures and not stats.harness_errors:
            stats.harness_errors.append("".join(traceback.format_exception(exc))[-3000:])
        stats.stopped = f"failure ({type(exc).__name__}): {str(exc)[:500]}"
    finally:
        runner.close()
        stats.seconds = time.monotonic() - started
    return stats


def fuzz_figures(target: Target, seconds: float, **kwargs: Any) -> dict[str, Any]:
    """`fuzz`'s figures as plain data, with whether it failed: what a process running it for
    another (tests/e2e/test_concurrent_fuzz.py, one process per configuration) sends back."""
    stats = fuzz(target, seconds, **kwargs)
    return {**stats.as_json(), "failed": stats.failed(), "reproducer_script": stats.reproducer_text()}
