"""A prompt's token ids cut into segments whose KV can be reused wherever they appear, and the
position-independent keys those segments are stored and looked up under.

Two ways to cut: at a separator (LMCache's convention, `blend_special_str`, default " # # "),
or at document boundaries that the request gives as token offsets. Separator tokens belong to
no segment: they are few and are always recomputed.

A tokenizer usually glues a separator's trailing whitespace to the next word (" # # The" is
" #", " #", " The" for Llama-style byte-level BPE, while " # # " alone is " #", " #", " "), so the
separator matches in two forms: as tokenized alone (prompts built from token ids) and without
its trailing whitespace-only tokens (prompts built from text). The segment after a separator in
a text prompt then starts with the glued token (" The"), so a document is found again in any
position as long as it always follows a separator: put one before the first document too.

Keys: a chunk's key hashes the salt (model identity and the request's cache salt), the previous
chunk's key *of the same segment* and the chunk's token ids. Chunks chain within a segment only,
never over what came before it, so a segment has the same keys at any position in any prompt.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

DEFAULT_SEPARATOR = " # # "
DEFAULT_CHUNK_SIZE = 256
KEY_DOMAIN = b"lmi-blend-segment-v1"
"""Prefixed to every hash, so that segment keys never equal keys of another scheme."""


class SegmentationError(ValueError):
    """A separator, boundary list or token list that cannot be segmented; the message says why."""


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Segment:
    """`token_ids` of the prompt from offset `start` (inclusive) to `end` (exclusive)."""

    start: int
    token_ids: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Separator:
    """The separator's token ids (tokenized once), and the shorter form a text prompt shows when the
    tokenizer glued its trailing whitespace to the next token."""

    token_ids: tuple[int, ...]
    glued_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise SegmentationError("the blend separator tokenizes to no tokens; choose a visible string like ' # # '")
        if self.glued_ids is not None and (
            not self.glued_ids or self.token_ids[: len(self.glued_ids)] != self.glued_ids or self.glued_ids == self.token_ids
        ):
            raise SegmentationError("glued_ids must be a shorter, non-empty prefix of token_ids")

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, text: str = DEFAULT_SEPARATOR) -> Separator:
        """Tokenize `text` once, without special tokens (no BOS in the middle of a prompt)."""
        if not text:
            raise SegmentationError("the blend separator is empty")
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise SegmentationError(f"the blend separator {text!r} tokenizes to no tokens")
        cut = len(ids)
        while cut > 1 and not tokenizer.decode([ids[cut - 1]]).strip():
            cut -= 1
        return cls(ids, ids[:cut] if cut < len(ids) else None)

    def forms(self) -> list[tuple[int, ...]]:
        """Longest first: where the whole separator matches, it is taken whole."""
        return [self.token_ids] + ([self.glued_ids] if self.glued_ids else [])


def split_at_separator(token_ids: Sequence[int], separator: Separator | Sequence[int]) -> list[Segment]:
    """The non-empty runs of tokens between separators, left to right.

    A separator at the start or end, two in a row, or none at all yield no empty segment: the
    result is what lies between them (the whole prompt when there is no separator, nothing
    for an empty prompt)."""
    sep = separator if isinstance(separator, Separator) else Separator(tuple(separator))
    forms = sep.forms()
    first = {form[0] for form in forms}
    tokens = list(token_ids)
    n = len(tokens)
    segments: list[Segment] = []
    start = i = 0
    while i < n:
        if tokens[i] in first:
            form = next((f for f in forms if tuple(tokens[i : i + len(f)]) == f), None)
            if form is not None:
                if i > start:
                    segments.append(Segment(start, tuple(tokens[start:i])))
                i += len(form)
                start = i
                continue
        i += 1
    if n > start:
        segments.append(Segment(start, tuple(tokens[start:n])))
    return segments


def split_at_boundaries(token_ids: Sequence[int], boundaries: Iterable[int]) -> list[Segment]:
    """Cut at the given token offsets (where each document starts). 0 and the prompt's length are
    implied; offsets must be strictly increasing and inside the prompt."""
    tokens = tuple(token_ids)
    cuts = list(boundaries)
    for offset in cuts:
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise SegmentationError(f"document boundaries are token offsets (integers), got {offset!r}")
        if not 0 <= offset <= len(tokens):
            raise SegmentationError(f"document boundary {offset} lies outside the prompt's {len(tokens)} tokens")
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise SegmentationError(f"document boundaries must be strictly increasing, got {cuts}")
    edges = [0] + [c for c in cuts if 0 < c < len(tokens)] + [len(tokens)]
    return [Segment(a, tokens[a:b]) for a, b in zip(edges, edges[1:]) if b > a]


def uncovered_offsets(segments: Sequence[Segment], n_tokens: int) -> list[int]:
    """Offsets of the prompt's tokens that belong to no segment (the separators' tokens)."""
    covered = bytearray(n_tokens)
    for seg in segments:
        covered[seg.start : seg.end] = b"\x01" * len(seg)
    return [i for i, c in enumerate(covered) if not c]


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def key_salt(model_identity: str, cache_salt: str | None = None) -> bytes:
    """The salt every key of one model and one cache namespace starts from.

    `model_identity` must change whenever the KV would (model weights, dtype, KV dtype, adapter);
    `cache_salt` is the request's (vLLM's `cache_salt`, as the server sets it per adapter and
    tenant), so segments are shared only where prefix KV is."""
    if not model_identity:
        raise SegmentationError("a segment key needs the model's identity")
    h = hashlib.sha256(KEY_DOMAIN + b"\0salt\0")
    h.update(model_identity.encode("utf-8"))
    h.update(b"\0" + (b"" if cache_salt is None else b"\1" + cache_salt.encode("utf-8")))
    return h.digest()


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    try:
        packed = array("I", token_ids)
    except (OverflowError, TypeError):
        raise SegmentationError("token ids must be integers in [0, 2**32)") from None
    if packed.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte unsigned int
        raise SegmentationError("this platform's unsigned int is not 4 bytes")
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


@dataclass(frozen=True)
class ChunkKey:
    """One chunk of a segment: its token span relative to the segment's start, and its key."""

    start: int
    end: int
    key: bytes

    def hex(self) -> str:
        return self.key.hex()


def segment_chunk_keys(
    token_ids: Sequence[int], salt: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> list[ChunkKey]:
    """Keys of a segment's chunks of `chunk_size` tokens (the last one may be shorter, since blending
    keeps a segment's tail too). Chunk i's key covers the segment's tokens [0, (i+1) x chunk_size):
    a hit on chunk i means the segment's first i+1 chunks are as stored."""
    if chunk_size <= 0:
        raise SegmentationError(f"chunk_size must be positive, got {chunk_size}")
    if len(salt) != 32:
        raise SegmentationError("the salt must be a 32-byte digest from key_salt()")
    keys: list[ChunkKey] = []
    previous = salt
    for start in range(0, len(token_ids), chunk_size):
        chunk = token_ids[start : start + chunk_size]
        h = hashlib.sha256(KEY_DOMAIN + b"\0chunk\0")
        h.update(previous)
        h.update(len(chunk).to_bytes(4, "little"))
        h.update(_token_bytes(chunk))
        previous = h.digest()
        keys.append(ChunkKey(start, start + len(chunk), previous))
    return keys


class ContextKeys:
    """Keys of a prompt's prefixes: the key at `end` hashes the salt and every token before `end`.
    A segment stored with the context key of its end, and found again with the same one, has KV
    computed after the very same tokens at the very same positions: exact, nothing to recompute.
    Asked for ends in increasing order, the prompt is hashed once."""

    def __init__(self, token_ids: Sequence[int], salt: bytes) -> None:
        self._tokens = token_ids
        self._hash = hashlib.sha256(KEY_DOMAIN + b"\0context\0" + salt)
        self._at = 0
        self._keys: dict[int, bytes] = {}

    def at(self, end: int) -> bytes:
        if end in self._keys:
            return self._keys[end]
        if not self._at <= end <= len(self._tokens):
            raise SegmentationError(f"context keys are asked for in increasing order within the prompt, got {end} after {self._at}")
        self._hash.update(_token_bytes(self._tokens[self._at : end]))
        self._at = end
        self._keys[end] = self._hash.copy().digest()
        return self._keys[end]


def segment_key(token_ids: Sequence[int], salt: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> bytes | None:
    """The key of the whole segment (its last chunk's), None for an empty one."""
    keys = segment_chunk_keys(token_ids, salt, chunk_size)
    return keys[-1].key if keys else None


# ---------------------------------------------------------------------------------------------
# Content-defined segmentation: documents found in ordinary prompts
# ---------------------------------------------------------------------------------------------

DEFAULT_MIN_PIECE = 64
DEFAULT_AVG_PIECE = 128
DEFAULT_WINDOW = 8
MIN_SEGMENT = 16
"""Pieces shorter than this are no segment: looked up and stored for a handful of tokens they would
cost more than they save (a chat template's role header, the blank line between documents)."""
HEADER_TOKENS = 8
"""A line break this close after a special token ends a chat template's role header."""

_MASK64 = (1 << 64) - 1
_ROLL = 0x100000001B3  # odd multiplier of the polynomial rolling hash


def _mix64(x: int) -> int:
    """splitmix64's finaliser: spreads every input bit over the output, so a modulus of the hash is
    as good as random while staying a pure function of the window's tokens."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class ContentCuts:
    """How a prompt without separators is cut where its content says so, the same way wherever a
    document stands.

    Hard cuts, before and after: special tokens (a chat template's `<|im_start|>`, `<|eot_id|>`), runs
    of line breaks holding a blank line (how documents are joined), and the line break that ends a
    role header (`user\\n` right after a special token). Between hard cuts, a piece ends where a
    rolling hash of its last `window` tokens hits a pattern (content-defined chunking over token
    ids), at least `min_len` and on average about `avg_len` tokens after the last cut, and at
    `max_len` at the latest. The hash window never reaches over a hard cut, so a document that
    follows one (a blank line, the user turn's header) is cut into the same pieces in any position;
    a document glued to its neighbour loses only the piece that straddles the join."""

    newlines: dict[int, int]
    """Token id -> line breaks it holds, for tokens that are whitespace only."""
    special_ids: frozenset[int]
    min_len: int = DEFAULT_MIN_PIECE
    avg_len: int = DEFAULT_AVG_PIECE
    max_len: int = DEFAULT_CHUNK_SIZE
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if not 0 < self.window <= self.min_len < self.avg_len <= self.max_len:
            raise SegmentationError(
                f"content cuts need 0 < window ({self.window}) <= min_len ({self.min_len}) < avg_len "
                f"({self.avg_len}) <= max_len ({self.max_len})"
            )

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, **sizes: int) -> ContentCuts:
        """Read once which token ids are line breaks and which are special (the whole vocabulary is
        decoded one id at a time: a byte-level BPE merges "\\n\\n" into one token, SentencePiece
        does not, and only the decoded text tells)."""
        size = len(tokenizer)  # type: ignore[arg-type]
        texts = tokenizer.batch_decode([[i] for i in range(size)])  # type: ignore[attr-defined]
        newlines = {i: t.count("\n") for i, t in enumerate(texts) if "\n" in t and not t.strip()}
        special = set(getattr(tokenizer, "all_special_ids", None) or ())
        for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                special.add(int(token_id))
        return cls(newlines, frozenset(special), **sizes)

    @property
    def _divisor(self) -> int:
        return self.avg_len - self.min_len


def _regions(tokens: list[int], cuts: ContentCuts) -> list[tuple[int, int, bool]]:
    """The prompt as (start, end, is_structure) runs between hard cuts, left to right."""
    special, newlines = cuts.special_ids, cuts.newlines
    regions: list[tuple[int, int, bool]] = []
    n = len(tokens)
    start = i = 0
    after_special = False  # the text since `start` follows a special token: a role header may end it
    while i < n:
        if tokens[i] not in special and tokens[i] not in newlines:
            i += 1
            continue
        j, breaks, has_special = i, 0, False
        while j < n and (tokens[j] in special or tokens[j] in newlines):
            breaks += newlines.get(tokens[j], 0)
            has_special = has_special or tokens[j] in special
            j += 1
        if has_special or breaks >= 2 or (after_special and breaks and i - start <= HEADER_TOKENS):
            if i > start:
                regions.append((start, i, False))
            regions.append((i, j, True))
            start, after_special = j, has_special
        i = j  # a single line break inside text is text (code keeps its lines together)
    if n > start:
        regions.append((start, n, False))
    return regions


def _content_pieces(tokens: list[int], start: int, end: int, cuts: ContentCuts) -> list[tuple[int, int]]:
    """Cut the text between two hard cuts where a rolling hash of the last `window` tokens hits the
    pattern (no cut that would leave fewer than `min_len` tokens before the next hard cut)."""
    pieces: list[tuple[int, int]] = []
    window, divisor = cuts.window, cuts._divisor
    drop = pow(_ROLL, window, 1 << 64)
    rolling = 0
    piece = start
    for i in range(start, end):
        rolling = (rolling * _ROLL + _mix64(tokens[i] + 1)) & _MASK64
        if i - start >= window:
            rolling = (rolling - _mix64(tokens[i - window] + 1) * drop) & _MASK64
        length = i + 1 - piece
        if length >= cuts.max_len or (
            length >= cuts.min_len and end - (i + 1) >= cuts.min_len and i + 1 - start >= window
            and _mix64(rolling) % divisor == 0
        ):
            pieces.append((piece, i + 1))
            piece = i + 1
    if end > piece:
        pieces.append((piece, end))
    return pieces


def split_at_content(token_ids: Sequence[int], cuts: ContentCuts) -> list[Segment]:
    """The prompt's pieces of at least `MIN_SEGMENT` tokens between content-defined cuts (see
    `ContentCuts`); structure (template tokens, blank lines) and shorter pieces belong to no segment."""
    tokens = list(token_ids)
    pieces = [
        piece
        for start, end, structure in _regions(tokens, cuts) if not structure
        for piece in _content_pieces(tokens, start, end, cuts)
    ]
    return [Segment(a, tuple(tokens[a:b])) for a, b in pieces if b - a >= MIN_SEGMENT]
