"""Images in chat end to end on the built-in tiny Qwen2-VL (option.model_id=tiny-qwen2-vl-shapes,
trained by scripts/train_tiny_vlm.py): pictures it never saw during training are answered right
through the official openai client and LMI's /invocations; hostile image inputs each get a 4xx and
the server keeps serving; nothing is fetched for a client from a host the operator did not allow
(a loopback server records every call); and KV is never shared between two pictures asked the same
question, neither in vLLM's prefix cache nor in LMCache, while the same picture and text is a hit.

One server: LMCache's cache server beside vLLM's prefix cache (on, as by default); the LMCache
check empties vLLM's prefix cache before each request (POST /reset_prefix_cache), so that the
cached tokens it reads are LMCache's hits alone."""

from __future__ import annotations

import base64
import importlib.util
import io
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from lmi_server.config.schema import VISION_SERVED_NAME as MODEL
from tests.support.prestart import prestartable
from tests.support.server import running_server

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAINER_SEED, TRAINER_N_TRAIN = 20261203, 6000  # the shipped model's training run (its held-out stream)
PROPS = {
    "option.model_id": MODEL,
    "option.cpu_kv_cache_space": "1",
    "option.allowed_media_domains": '["localhost"]',  # the recorder's name; 127.0.0.1 stays refused
}
# A system prompt long enough that the picture's tokens fall inside a full vLLM block (128 tokens
# on CPU) and a full LMCache chunk (256): 267 prompt tokens with the picture at about 220-240.
SYSTEM = "You answer questions about one figure in a picture. " * 5
# The same length in tokens, other chunk keys: the LMCache check starts with nothing of the prefix
# cache check's chunks (its pictures) stored.
OTHER_SYSTEM = "Now answer questions about one figure in a picture. " * 5


@pytest.fixture(scope="module")
def tv():
    spec = importlib.util.spec_from_file_location("train_tiny_vlm", REPO / "scripts" / "train_tiny_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny_vlm"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def held_out(tv):
    """Pictures drawn from the trainer's held-out stream (none matches a training picture)."""
    return tv.make_split(TRAINER_SEED, TRAINER_N_TRAIN, 400)[1]


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def pick(held_out, colour: str, shape: str):
    return next(f for f in held_out if (f.colour, f.shape) == (colour, shape))


class Recorder:
    """A loopback HTTP server that serves one PNG and records every path asked of it."""

    def __init__(self, body: bytes):
        calls = self.calls = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                calls.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture(scope="module")
@prestartable
def server(tmp_path_factory):
    """The vision model with LMCache's cache server (256-token chunks on CPU) and vLLM's prefix
    cache on."""
    model_dir = tmp_path_factory.mktemp("vision-model")
    (model_dir / "lmcache.yaml").write_text("chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n")
    with running_server(model_dir, {**PROPS, "option.lmcache_config_file": "lmcache.yaml"}) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def messages(url: str, question: str, system: str | None = None) -> list[dict]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


def chat(server, msgs, max_tokens: int = 8) -> httpx.Response:
    body = {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)


def answer_and_cached(server, msgs) -> tuple[str, int, int]:
    r = chat(server, msgs)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return r.json()["choices"][0]["message"]["content"].strip(), usage["prompt_tokens"], cached


def still_serving(server, held_out, tv) -> None:
    fig = held_out[0]
    r = chat(server, messages(data_url(png(tv.draw(fig))), "What colour is the shape?"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].strip() == fig.colour


# ---------------------------------------------------------------------------------------------
# Right answers
# ---------------------------------------------------------------------------------------------


def test_openai_client_red_circle(client, held_out, tv):
    (model,) = [m.id for m in client.models.list().data]
    assert model == MODEL
    url = data_url(png(tv.draw(pick(held_out, "red", "circle"))))

    def ask(question: str) -> str:
        out = client.chat.completions.create(model=model, messages=messages(url, question), max_tokens=8, temperature=0)
        return out.choices[0].message.content.strip()

    assert ask("What colour is the shape?") == "red"
    assert ask("What shape is it?") == "circle"
    assert ask("Describe the figure.") == "a red circle"


def test_held_out_pictures_answered(server, held_out, tv):
    """Colour and shape of 15 pictures never trained on: at least 90 % right (the trainer's
    held-out figure is 1.00 / 0.95)."""
    right = total = 0
    for fig in held_out[:15]:
        url = data_url(png(tv.draw(fig)))
        for question, expected in (("What colour is the shape?", fig.colour), ("What shape is it?", fig.shape)):
            r = chat(server, messages(url, question))
            assert r.status_code == 200, r.text
            right += r.json()["choices"][0]["message"]["content"].strip() == expected
            total += 1
    assert right / total >= 0.9, f"{right}/{total}"


def test_invocations_chat_schema_with_image(server, held_out, tv):
    fig = pick(held_out, "blue", "square")
    body = {"messages": messages(data_url(png(tv.draw(fig))), "Describe the figure."),
            "parameters": {"max_new_tokens": 8, "temperature": 0}}
    r = httpx.post(server.base_url + "/invocations", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["content"].strip() == "a blue square"


def test_allowed_host_is_fetched(server, held_out, tv):
    """option.allowed_media_domains names a host: its pictures are fetched and read."""
    fig = pick(held_out, "green", "triangle")
    recorder = Recorder(png(tv.draw(fig)))
    try:
        r = chat(server, messages(f"http://localhost:{recorder.port}/figure.png", "What shape is it?"))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].strip() == "triangle"
        assert recorder.calls == ["/figure.png"]
    finally:
        recorder.close()


# ---------------------------------------------------------------------------------------------
# Hostile inputs
# ---------------------------------------------------------------------------------------------


def test_url_to_a_host_not_allowed_is_never_fetched(server, held_out, tv):
    recorder = Recorder(png(tv.draw(held_out[0])))
    try:
        for url in (f"http://127.0.0.1:{recorder.port}/x.png", f"https://127.0.0.1:{recorder.port}/x.png",
                    f"http://localhost.evil.example:{recorder.port}/x.png"):
            r = chat(server, messages(url, "What shape is it?"))
            assert r.status_code == 400, (url, r.text)
            assert "allowed_media_domains" in r.json()["error"]["message"]
        assert recorder.calls == []
    finally:
        recorder.close()
    still_serving(server, held_out, tv)


def huge_png(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height 1-bit pixels (gigapixels for a few hundred
    bytes): a decoder that trusts it allocates the whole picture."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    idat = zlib.compress(row * 64, 9)  # the first rows; the rest would inflate the same way
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + \
        chunk(b"IDAT", idat) + chunk(b"IEND", b"")


HOSTILE = {
    "local path": ("/etc/passwd", 400, "only data: URLs"),
    "file URL": ("file:///etc/passwd", 400, "only data: URLs"),
    "truncated PNG": (None, 400, "decode"),
    "not an image": (data_url(b"PK\x03\x04" + b"\x00" * 200, "image/png"), 400, ""),
    "huge-pixel PNG": (data_url(huge_png(60000, 60000)), 400, "max_image_pixels"),
    "50 MB image": (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * (50 * 1024 * 1024)), 413, ""),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_image_gets_4xx_and_server_keeps_serving(server, held_out, tv, case):
    url, status, words = HOSTILE[case]
    if url is None:
        whole = png(tv.draw(held_out[1]))
        url = data_url(whole[: len(whole) // 2])
    r = chat(server, messages(url, "What shape is it?"))
    assert r.status_code == status, (case, r.status_code, r.text[:300])
    if status == 400:
        assert words.lower() in r.json()["error"]["message"].lower(), r.text
    still_serving(server, held_out, tv)


def test_one_hundred_images_in_one_prompt(server, held_out, tv):
    url = data_url(png(tv.draw(held_out[2])))
    content = [{"type": "image_url", "image_url": {"url": url}} for _ in range(100)] + [{"type": "text", "text": "What shape is it?"}]
    r = chat(server, [{"role": "user", "content": content}])
    assert r.status_code == 400
    assert "limit_mm_per_prompt" in r.json()["error"]["message"]
    still_serving(server, held_out, tv)


# ---------------------------------------------------------------------------------------------
# KV reuse with images
# ---------------------------------------------------------------------------------------------


def two_pictures(server, held_out, tv, system: str = SYSTEM, cold: bool = False):
    """`ask("red")` / `ask("blue")`: the long system prompt and one question about a held-out red
    circle or blue square; answers (text, prompt tokens, cached tokens). `cold`: vLLM's prefix
    cache emptied before each request (what is cached then comes from LMCache)."""
    urls = {colour: data_url(png(tv.draw(pick(held_out, colour, shape)))) for colour, shape in (("red", "circle"), ("blue", "square"))}

    def ask(colour: str) -> tuple[str, int, int]:
        if cold:
            reset_prefix_cache(server)
        return answer_and_cached(server, messages(urls[colour], "Describe the figure.", system))

    return ask


def reset_prefix_cache(server, timeout: float = 60) -> None:
    """Empty vLLM's prefix cache (a 409 while a KV store still holds blocks: try again)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.post(server.base_url + "/reset_prefix_cache", timeout=30)
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text


def test_prefix_cache_never_shares_kv_between_pictures(server, held_out, tv):
    """vLLM's prefix cache (on by default): the same long system prompt and question with another
    picture reuses only the block before the picture (LMCache's one chunk holds the picture: no
    hit there); the same picture and text again reuses every full block, and answers as it did."""
    ask = two_pictures(server, held_out, tv)
    first, prompt_tokens, cached0 = ask("red")
    assert prompt_tokens >= 256 and cached0 == 0
    other, _, cached_other = ask("blue")
    assert cached_other < 256, "the block holding the picture was reused for another picture"
    assert "blue" in other and "red" not in other
    again, _, cached_again = ask("red")
    assert cached_again >= 256 and again == first
    assert "red" in again


def test_lmcache_never_shares_kv_between_pictures(server, held_out, tv):
    """LMCache's chunk keys carry the picture: another picture with the same text is a miss, the
    same picture and text a 256-token hit with the same answer. vLLM's prefix cache is emptied
    before each request, so cached_tokens counts LMCache hits only."""
    ask = two_pictures(server, held_out, tv, system=OTHER_SYSTEM, cold=True)
    first, prompt_tokens, cached0 = ask("red")
    assert prompt_tokens >= 256 and cached0 == 0
    other, _, cached_other = ask("blue")
    assert cached_other == 0, "LMCache served the first picture's chunk for another picture"
    assert "blue" in other and "red" not in other
    again, _, cached_again = ask("red")
    assert cached_again == 256 and again == first
    other_again, _, cached_other_again = ask("blue")
    assert cached_other_again == 256 and other_again == other
    metrics = httpx.get(server.base_url + "/metrics", timeout=30).text
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:external_prefix_cache_hits_total")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 512
