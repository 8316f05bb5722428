"""Text embeddings end to end on the built-in all-MiniLM-L6-v2 (option.model_id=all-minilm-l6-v2):
the vectors the server gives (OpenAI's /v1/embeddings through the official client, LMI's
/invocations) equal sentence-transformers' own for the same texts from the same package
directory; `use_activation=false` in a request gives the un-normalized ones; a batch, base64, dimensions and
the token limit behave as documented; bad requests get a 4xx and the server keeps serving."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from lmi_server.demo.embedding import DIMENSIONS, MAX_TOKENS, SERVED_NAME, model_dir
from tests.support.prestart import prestartable
from tests.support.server import running_server

pytestmark = pytest.mark.e2e

PROPS = {"option.model_id": SERVED_NAME, "option.cpu_kv_cache_space": "1", "option.max_request_bytes": "200000"}
TEXTS = [
    "What is Deep Learning?",
    "How many ways can I peel an orange?",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors that capture meaning.",
    "Paris is the capital of France.",
    "a",
]
LONG_TEXT = "word " * (MAX_TOKENS + 100)


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers on the package's own directory: the vectors the model should give."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir()), device="cpu")  # Transformer, mean Pooling, Normalize
    unnormalized = SentenceTransformer(modules=[st[0], st[1]], device="cpu")  # without the Normalize module

    def encode(texts, normalize=True):
        return (st if normalize else unnormalized).encode(texts, convert_to_numpy=True)

    return encode


@pytest.fixture(scope="module")
@prestartable
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("embed-model"), PROPS) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def still_serving(server) -> None:
    r = httpx.post(server.base_url + "/invocations", json={"inputs": "still here"}, timeout=60)
    assert r.status_code == 200 and len(r.json()[0]) == DIMENSIONS


def test_openai_client_vectors_equal_sentence_transformers(client, reference):
    (model,) = [m.id for m in client.models.list().data]
    assert model == SERVED_NAME
    out = client.embeddings.create(model=model, input=TEXTS)
    got = [d.embedding for d in sorted(out.data, key=lambda d: d.index)]
    assert len(got) == len(TEXTS) and all(len(v) == DIMENSIONS for v in got)
    assert cosines(got, reference(TEXTS)).min() >= 0.999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)  # normalized, as the model's Normalize module does
    assert out.usage.prompt_tokens > len(TEXTS)


def test_base64_encoding_gives_the_same_vectors(client, reference):
    # Asked for explicitly, the client hands the base64 strings over as they came (unasked, it
    # requests base64 itself and decodes it: the first test); float32, little-endian, as OpenAI's.
    out = client.embeddings.create(model=SERVED_NAME, input=TEXTS[:2], encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in out.data]
    assert all(len(v) == DIMENSIONS for v in decoded)
    assert cosines(decoded, reference(TEXTS[:2])).min() >= 0.999
    floats = httpx.post(str(client.base_url) + "embeddings", json={"input": TEXTS[:2], "encoding_format": "float"}, timeout=60)
    assert np.allclose([d["embedding"] for d in floats.json()["data"]], decoded, atol=1e-6)


def test_lmi_invocations_answer_a_list_of_vectors(server, reference):
    one = httpx.post(server.base_url + "/invocations", json={"inputs": TEXTS[0]}, timeout=60)
    assert one.status_code == 200
    (vector,) = one.json()
    assert cosines([vector], reference(TEXTS[:1]))[0] >= 0.999
    batch = httpx.post(server.base_url + "/invocations", json={"inputs": TEXTS}, timeout=60)
    assert batch.status_code == 200 and len(batch.json()) == len(TEXTS)
    assert cosines(batch.json(), reference(TEXTS)).min() >= 0.999


def test_a_batch_of_64_texts_keeps_its_order(client, reference):
    texts = [f"sentence number {i} is about {TEXTS[i % len(TEXTS)].lower()}" for i in range(64)]
    out = client.embeddings.create(model=SERVED_NAME, input=texts)
    assert [d.index for d in out.data] == list(range(64))
    assert cosines([d.embedding for d in out.data], reference(texts)).min() >= 0.999


def test_a_text_over_the_token_limit_is_a_400_unless_truncation_is_asked(server, client, reference):
    openai = httpx.post(server.base_url + "/v1/embeddings", json={"input": [TEXTS[0], LONG_TEXT]}, timeout=60)
    assert openai.status_code == 400, openai.text
    assert str(MAX_TOKENS) in openai.json()["error"]["message"]
    lmi = httpx.post(server.base_url + "/invocations", json={"inputs": LONG_TEXT}, timeout=60)
    assert lmi.status_code == 400 and lmi.json()["code"] == 400 and str(MAX_TOKENS) in lmi.json()["error"]
    still_serving(server)
    truncated = httpx.post(
        server.base_url + "/invocations", json={"inputs": LONG_TEXT, "parameters": {"truncate_prompt_tokens": -1}}, timeout=60
    )
    assert truncated.status_code == 200 and len(truncated.json()[0]) == DIMENSIONS
    out = client.embeddings.create(model=SERVED_NAME, input=[LONG_TEXT], extra_body={"truncate_prompt_tokens": MAX_TOKENS})
    assert len(out.data[0].embedding) == DIMENSIONS


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/embeddings", {"input": "x", "dimensions": 128}, 400, "Matryoshka"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 422, "encoding_format"),
    ("/v1/embeddings", {"input": []}, 400, ""),
    ("/v1/chat/completions", {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}]}, 400, "embeds text"),
    ("/v1/completions", {"model": SERVED_NAME, "prompt": "hi"}, 400, "embeds text"),
    ("/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 5}}, 400, "max_new_tokens"),
    ("/invocations", {"prompt": "hi"}, 400, "embeds text"),
    ("/invocations", {"inputs": []}, 400, "empty"),
    ("/invocations", {"inputs": "x", "parameters": {"dimensions": 128}}, 400, "Matryoshka"),
])
def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(server, path, body, status, needle):
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    message = error if path == "/invocations" else error["message"]  # LMI's flat body on /invocations
    assert needle in message
    still_serving(server)


def test_normalize_false_gives_the_unnormalized_vectors(server, client, reference):
    """Per request (vLLM's `use_activation=false`, what option.normalize=false sets for the whole
    server through pooler_config.use_activation; that mapping: tests/unit/config/test_lmi_keys.py),
    on the shared server: through the official client and a plain HTTP body alike."""
    raw_reference = reference(TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(raw_reference, axis=1), 1.0, atol=1e-2)  # the check below means something
    body = httpx.post(server.base_url + "/v1/embeddings", json={"input": TEXTS, "use_activation": False}, timeout=60)
    assert body.status_code == 200, body.text
    got = [d["embedding"] for d in sorted(body.json()["data"], key=lambda d: d["index"])]
    out = client.embeddings.create(model=SERVED_NAME, input=TEXTS, extra_body={"use_activation": False})
    via_openai = [d.embedding for d in sorted(out.data, key=lambda d: d.index)]
    for vectors in (got, via_openai):
        assert cosines(vectors, raw_reference).min() >= 0.999
        assert np.allclose(np.linalg.norm(vectors, axis=1), np.linalg.norm(raw_reference, axis=1), rtol=1e-3)
    still_serving(server)  # and the next request is normalized again: the option was this request's only
    normal = client.embeddings.create(model=SERVED_NAME, input=TEXTS[:1])
    assert np.allclose(np.linalg.norm(normal.data[0].embedding), 1.0, atol=1e-4)


def test_score_and_rerank_are_the_cosine_of_the_reference_vectors(server, reference):
    query, docs = TEXTS[0], [TEXTS[1], TEXTS[3], TEXTS[4]]
    vectors = reference([query, *docs])
    expected = cosines(np.repeat(vectors[:1], len(docs), axis=0), vectors[1:])
    scored = httpx.post(server.base_url + "/score", json={"model": SERVED_NAME, "text_1": query, "text_2": docs}, timeout=60)
    assert scored.status_code == 200, scored.text
    got = [d["score"] for d in sorted(scored.json()["data"], key=lambda d: d["index"])]
    assert np.allclose(got, expected, atol=1e-3)
    reranked = httpx.post(server.base_url + "/rerank", json={"model": SERVED_NAME, "query": query, "documents": docs}, timeout=60)
    assert reranked.status_code == 200, reranked.text
    assert [r["index"] for r in reranked.json()["results"]] == list(np.argsort(-expected))
