"""Segmentation at a separator and at document boundaries, and segment keys that do not depend on
where a segment stands."""

from pathlib import Path

import pytest

from lmi_server.kvcache.blend.segments import (
    Segment,
    SegmentationError,
    Separator,
    key_salt,
    segment_chunk_keys,
    segment_key,
    split_at_boundaries,
    split_at_separator,
    uncovered_offsets,
)

SEP = (7, 7, 9)


def spans(segments):
    return [(s.start, list(s.token_ids)) for s in segments]


def test_split_between_separators():
    tokens = [1, 2, *SEP, 3, 4, 5, *SEP, 6]
    assert spans(split_at_separator(tokens, SEP)) == [(0, [1, 2]), (5, [3, 4, 5]), (11, [6])]


def test_separator_at_start_end_twice_in_a_row_or_absent():
    assert spans(split_at_separator([*SEP, 1, 2], SEP)) == [(3, [1, 2])]
    assert spans(split_at_separator([1, 2, *SEP], SEP)) == [(0, [1, 2])]
    assert spans(split_at_separator([1, *SEP, *SEP, 2], SEP)) == [(0, [1]), (7, [2])]
    assert spans(split_at_separator([1, 2, 3], SEP)) == [(0, [1, 2, 3])]
    assert split_at_separator([], SEP) == []
    assert split_at_separator(list(SEP), SEP) == []


def test_a_partial_separator_is_ordinary_text():
    assert spans(split_at_separator([1, 7, 7, 2, 7, 9], SEP)) == [(0, [1, 7, 7, 2, 7, 9])]
    assert spans(split_at_separator([1, 7, 7], SEP)) == [(0, [1, 7, 7])]


def test_glued_form_matches_where_whitespace_joined_the_next_word():
    sep = Separator(SEP, glued_ids=(7, 7))
    tokens = [1, *SEP, 2, 7, 7, 30, 31]  # ids-built separator, then a text-built one (" The")
    assert spans(split_at_separator(tokens, sep)) == [(0, [1]), (4, [2]), (7, [30, 31])]


def test_segments_and_separators_cover_the_prompt():
    tokens = [*SEP, 1, 2, *SEP, *SEP, 3, *SEP]
    segments = split_at_separator(tokens, SEP)
    gaps = uncovered_offsets(segments, len(tokens))
    assert sorted(gaps + [i for s in segments for i in range(s.start, s.end)]) == list(range(len(tokens)))
    assert len(gaps) == 4 * len(SEP)


def test_bad_separators_are_refused():
    with pytest.raises(SegmentationError):
        Separator(())
    with pytest.raises(SegmentationError):
        Separator(SEP, glued_ids=(9,))


def test_split_at_document_boundaries():
    tokens = list(range(10, 20))
    assert spans(split_at_boundaries(tokens, [3, 7])) == [(0, [10, 11, 12]), (3, [13, 14, 15, 16]), (7, [17, 18, 19])]
    assert spans(split_at_boundaries(tokens, [0, 10])) == [(0, tokens)]
    assert spans(split_at_boundaries(tokens, [])) == [(0, tokens)]
    assert split_at_boundaries([], []) == []


@pytest.mark.parametrize("bad", [[5, 3], [3, 3], [-1], [11], [2.5], [True]])
def test_bad_boundaries_are_refused(bad):
    with pytest.raises(SegmentationError):
        split_at_boundaries(list(range(10)), bad)


def test_segment_keys_do_not_depend_on_position_or_neighbours():
    salt = key_salt("model-a")
    doc = list(range(100, 700))
    first = split_at_separator([*doc, *SEP, 5, 6], SEP)[0]
    later = split_at_separator([1, 2, 3, *SEP, *doc, *SEP, 8], SEP)[1]
    assert first.start != later.start and first.token_ids == later.token_ids
    assert segment_chunk_keys(first.token_ids, salt) == segment_chunk_keys(later.token_ids, salt)


def test_chunk_keys_chain_within_the_segment():
    salt = key_salt("model-a")
    doc = list(range(600))
    keys = segment_chunk_keys(doc, salt, chunk_size=256)
    assert [(k.start, k.end) for k in keys] == [(0, 256), (256, 512), (512, 600)]
    assert len({k.key for k in keys}) == 3
    # the same second chunk after another first chunk is another key; the first chunk's is unchanged
    other = segment_chunk_keys([1] + doc[1:], salt, chunk_size=256)
    assert other[0].key != keys[0].key and other[1].key != keys[1].key
    assert segment_chunk_keys(doc[:256], salt)[0] == keys[0]
    assert segment_key(doc, salt) == keys[-1].key
    assert segment_key([], salt) is None


def test_keys_are_salted_by_model_and_cache_salt():
    doc = list(range(50))
    keys = {
        segment_key(doc, key_salt("model-a")),
        segment_key(doc, key_salt("model-b")),
        segment_key(doc, key_salt("model-a", "tenant-1")),
        segment_key(doc, key_salt("model-a", "tenant-2")),
        segment_key(doc, key_salt("model-a", "")),
    }
    assert len(keys) == 5
    assert segment_key(doc, key_salt("model-a", "t")) == segment_key(doc, key_salt("model-a", "t"))


def test_keys_are_stable_across_processes():
    """Keys go to a shared cache: they must not depend on the interpreter (no hash())."""
    assert segment_key([1, 2, 3], key_salt("m")).hex()[:16] == segment_key([1, 2, 3], key_salt("m")).hex()[:16]
    assert len(segment_key([1, 2, 3], key_salt("m"))) == 32


def test_bad_key_inputs_are_refused():
    with pytest.raises(SegmentationError):
        key_salt("")
    with pytest.raises(SegmentationError):
        segment_chunk_keys([1, 2], b"short")
    with pytest.raises(SegmentationError):
        segment_chunk_keys([1, -2], key_salt("m"))
    with pytest.raises(SegmentationError):
        segment_chunk_keys([1, 2], key_salt("m"), chunk_size=0)


def _local_tokenizer():
    transformers = pytest.importorskip("transformers")
    for path in sorted((Path.home() / ".cache" / "lmi_server").glob("*")):
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return transformers.AutoTokenizer.from_pretrained(str(path))
    pytest.skip("no local tokenizer (make setup builds one)")


def test_real_tokenizer_text_prompts_split_in_both_forms():
    tok = _local_tokenizer()
    sep = Separator.from_tokenizer(tok, " # # ")
    assert sep.glued_ids is not None, "byte-level BPE glues the trailing space to the next word"
    docs = ["The first document is about cats.", "The second one is about dogs.", "What do they say?"]
    ids = tok.encode("".join(" # # " + d for d in docs), add_special_tokens=False)
    segments = split_at_separator(ids, sep)
    # each document after a separator starts with the token that took the separator's space
    assert [tok.decode(list(s.token_ids)) for s in segments] == [" " + d for d in docs]
    # a prompt built from token ids (separator ids between documents' ids) splits the same way
    doc_ids = [tok.encode(d, add_special_tokens=False) for d in docs]
    built = [i for d in doc_ids for i in (*sep.token_ids, *d)]
    assert [list(s.token_ids) for s in split_at_separator(built, sep)] == doc_ids


def test_segment_is_its_tokens_from_start():
    seg = Segment(4, (1, 2, 3))
    assert (seg.start, seg.end, len(seg)) == (4, 7, 3)
