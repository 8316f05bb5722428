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


def segment_key(token_ids: Sequence[int], salt: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> bytes | None:
    """The key of the whole segment (its last chunk's), None for an empty one."""
    keys = segment_chunk_keys(token_ids, salt, chunk_size)
    return keys[-1].key if keys else None
