"""Content-defined segmentation: a document is cut into the same pieces wherever it stands in a
prompt without separators (after a blank line, after the user turn's header, before the end of
the turn), pieces stay within one chunk, and the chat template's tokens belong to no piece."""

import random
from pathlib import Path

import pytest

from lmi_server.kvcache.blend.segments import (
    MIN_SEGMENT,
    ContentCuts,
    SegmentationError,
    split_at_content,
)

NL, SPECIAL = 1, 2  # a line break token, a special token
CUTS = ContentCuts(newlines={NL: 1, 3: 2}, special_ids=frozenset({SPECIAL}), min_len=16, avg_len=32, max_len=64, window=4)


def doc(seed: int, n: int = 300) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 5000) for _ in range(n)]


def piece_sets(ids, cuts=CUTS):
    return {tuple(s.token_ids) for s in split_at_content(ids, cuts)}


def chat(docs, system=(SPECIAL, 40, NL, *range(200, 260), SPECIAL, NL)):
    """A ChatML-like prompt: system turn, user header, documents joined by blank lines, end of turn."""
    body = []
    for i, d in enumerate(docs):
        body += ([NL, NL] if i else []) + d
    return [*system, SPECIAL, 41, NL, *body, SPECIAL, NL, SPECIAL, 42, NL]


def test_a_document_is_cut_the_same_wherever_it_stands():
    docs = [doc(i) for i in range(4)]
    first = split_at_content(chat([docs[0], docs[1], docs[2], docs[3]]), CUTS)
    later = split_at_content(chat([docs[3], docs[1], docs[0], docs[2]]), CUTS)
    before = {tuple(s.token_ids) for s in first}
    # every piece of the permuted prompt was a piece of the first one: the documents' content
    # alone decides the cuts, the position (first, middle, last) does not
    assert {tuple(s.token_ids) for s in later} <= before
    covered = sum(len(s) for s in later)
    assert covered >= sum(map(len, docs)), "every document token lies in a piece"
    for d in docs:  # no piece straddles two documents or takes template tokens
        inside = [s for s in later if set(s.token_ids) <= set(d)]
        assert sum(len(s) for s in inside) == len(d)


def test_pieces_respect_the_sizes():
    ids = doc(7, 5000)
    pieces = split_at_content(ids, CUTS)
    lengths = [len(p) for p in pieces]
    assert max(lengths) <= CUTS.max_len
    assert min(lengths[:-1]) >= CUTS.min_len
    assert 20 <= sum(lengths) / len(lengths) <= 48, "about avg_len on average"
    assert sum(lengths) == len(ids)  # no structure: the pieces cover the prompt


def test_a_document_glued_to_its_neighbour_loses_only_the_straddling_piece():
    a, b = doc(1, 600), doc(2, 600)
    alone = piece_sets(b)
    glued = split_at_content([*a, *b], CUTS)
    in_b = [s for s in glued if s.start >= len(a)]
    assert sum(len(s) for s in in_b if tuple(s.token_ids) in alone) >= len(b) - 2 * CUTS.max_len


def test_template_tokens_and_blank_lines_belong_to_no_piece():
    d = doc(3, 100)
    ids = chat([d])
    pieces = split_at_content(ids, CUTS)
    assert all(SPECIAL not in s.token_ids and NL not in s.token_ids for s in pieces)
    assert all(len(s) >= MIN_SEGMENT for s in pieces)
    # a single line break inside text is text (code keeps its lines together)
    lines = [t for i in range(30) for t in (*doc(i, 9), NL)]
    assert sum(len(s) for s in split_at_content(lines, CUTS)) == len(lines)


def test_sizes_are_checked():
    with pytest.raises(SegmentationError, match="min_len"):
        ContentCuts(newlines={}, special_ids=frozenset(), min_len=64, avg_len=32, max_len=256)


def _local_tokenizer():
    transformers = pytest.importorskip("transformers")
    for path in sorted((Path.home() / ".cache" / "lmi_server").glob("*")):
        if (path / "tokenizer.json").is_file():
            return transformers.AutoTokenizer.from_pretrained(str(path))
    pytest.skip("no local tokenizer (make setup builds one)")


def test_real_chat_prompts_of_permuted_documents_share_their_pieces():
    """LMCache's long-doc-permutator's prompts: a system prompt, documents of single-token words
    joined by blank lines in one user message, in another order per request."""
    tok = _local_tokenizer()
    cuts = ContentCuts.from_tokenizer(tok)
    rng = random.Random(0)
    words = [w for w in ("alpha beta gamma delta river stone cloud paper green house light table "
                         "music north water seven").split()]
    docs = [" ".join(rng.choice(words) for _ in range(400)) + "." for _ in range(4)]

    def ids(order):
        messages = [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(120))},
                    {"role": "user", "content": "\n\n".join(docs[i] for i in order)}]
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    first, later = ids([0, 1, 2, 3]), ids([2, 3, 1, 0])
    stored = piece_sets(first, cuts)
    pieces = split_at_content(later, cuts)
    found = sum(len(s) for s in pieces if tuple(s.token_ids) in stored)
    doc_tokens = sum(len(tok.encode(d, add_special_tokens=False)) for d in docs)
    assert found >= 0.98 * doc_tokens, (found, doc_tokens)
    assert all(cuts.special_ids.isdisjoint(s.token_ids) for s in pieces)
