"""The awscurl stand-in the LMI integration-client runner uses: it must report failures the way
LMI's client reads them (`error rate: 100` when every request fails), or the client's load phase
would pass on a broken server."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lmi_client" / "awscurl.py"


def _load():
    spec = importlib.util.spec_from_file_location("awscurl_stand_in", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def server():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append(body)
            if body.get("fail"):
                status, payload = 424, {"error": "bad", "code": 424}
            elif body.get("stream_error"):
                status, payload = 200, {"token": {"id": -1}, "details": {"finish_reason": "error"}}
            else:
                status, payload = 200, {"generated_text": "ok"}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/invocations", seen
    httpd.shutdown()


@pytest.mark.parametrize("body, rate", [({"inputs": "x"}, "error rate: 0,"), ({"fail": True}, "error rate: 100,"),
                                        ({"stream_error": True}, "error rate: 100,")])
def test_error_rate_is_printed_as_lmis_client_reads_it(server, capsys, body, rate):
    url, seen = server
    assert _load().main(["-c", "2", "-N", "3", "-X", "POST", url, "-H", "Content-type: application/json", "-d", json.dumps(body), "-P", "-t"]) == 0
    assert rate in capsys.readouterr().out and len(seen) == 6


def test_a_dataset_is_sent_file_by_file(server, tmp_path, capsys):
    url, seen = server
    for i in range(3):
        (tmp_path / f"prompt{i}.txt").write_text(json.dumps({"inputs": f"p{i}"}))
    _load().main(["-c", "1", "-N", "3", "-X", "POST", url, "--dataset", str(tmp_path)])
    assert sorted(b["inputs"] for b in seen) == ["p0", "p1", "p2"] and "error rate: 0," in capsys.readouterr().out
