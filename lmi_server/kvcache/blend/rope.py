"""Exact RoPE re-rotation of cached K: KV computed with the segment at position p, moved to q.

RoPE rotates each pair of K's rotary dimensions by `position x inv_freq[i]`. Rotations of one
plane compose, R(a) R(b) = R(a + b), so K at q is K at p rotated by q - p; V carries no position.

The angle of the re-rotation is taken from the engine's own cos/sin of p and of q (as the engine
computes them: float32 `inv_freq`, float32 `position x inv_freq`), composed in float64:
cos(q - p) = cos q cos p + sin q sin p, sin(q - p) = sin q cos p - cos q sin p. What comes out is
exactly the inverse of the rotation the engine applied at p followed by the one it applies at q,
so the result equals the engine's K at q to float32 rounding at every position. Rotating by
cos/sin of `(q - p) x inv_freq` instead would differ by the engine's own rounding of its angles,
which grows with the position (about 2.4e-4 rad at position 4,000 for the fastest frequency).

Neox style only (rotate the two halves of the rotary dimensions against each other), which is
what vLLM and Hugging Face use for Llama, Qwen2 and Qwen3; partial rotary (`partial_rotary_factor`)
rotates the first dimensions of each head and leaves the rest. RoPE types: default, llama3,
linear. Others (yarn's attention scaling, dynamic NTK that changes with the length, longrope,
mrope, per-layer-type RoPE) are refused with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
_WHY_NOT: dict[str, str] = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence's length, so cached K "
    "cannot be moved exactly",
    "yarn": "YaRN scaling (attention factor and ramp) is not implemented for re-rotation yet",
    "longrope": "LongRoPE switches frequency tables with the sequence's length",
    "su": "LongRoPE (su) switches frequency tables with the sequence's length",
    "ntk": "NTK scaling is not implemented for re-rotation yet",
    "mrope": "multimodal RoPE (mrope) rotates with several position ids per token",
    "deepseek_yarn": "DeepSeek's YaRN variant is not implemented for re-rotation",
}


class RopeConfigError(ValueError):
    """A model whose RoPE cannot be re-rotated exactly; the message names the setting and why."""


@dataclass(frozen=True)
class RopeSpec:
    """The rotary geometry of one model, as the engine computes it."""

    head_dim: int
    rotary_dim: int
    base: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise RopeConfigError(_unsupported(self.rope_type))
        if self.head_dim <= 0 or self.rotary_dim <= 0 or self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise RopeConfigError(
                f"rotary_dim {self.rotary_dim} must be even and within head_dim {self.head_dim}"
            )
        if self.base <= 0:
            raise RopeConfigError(f"rope_theta must be positive, got {self.base}")
        if self.factor <= 0:
            raise RopeConfigError(f"rope scaling factor must be positive, got {self.factor}")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> RopeSpec:
        """From a Hugging Face `config.json` mapping, old style (`rope_theta` + `rope_scaling`) or
        new style (`rope_parameters`, transformers 5)."""
        params = dict(_rope_parameters(config))
        head_dim = config.get("head_dim")
        if not head_dim:
            try:
                head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                raise RopeConfigError("config.json gives neither head_dim nor hidden_size / num_attention_heads") from None
        head_dim = int(head_dim)
        if params.get("mrope_section") is not None:
            raise RopeConfigError(_unsupported("mrope"))
        partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        rope_dim = params.get("rope_dim")
        if rope_dim:
            rotary_dim = int(rope_dim)
        else:
            try:
                partial = float(partial)
            except (TypeError, ValueError):
                raise RopeConfigError(f"partial_rotary_factor must be a number, got {partial!r}") from None
            if not 0.0 < partial <= 1.0:
                raise RopeConfigError(f"partial_rotary_factor must be in (0, 1], got {partial}")
            rotary_dim = int(head_dim * partial)
        rope_type = str(params.get("rope_type") or params.get("type") or "default")
        base = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        kwargs: dict[str, Any] = {}
        if rope_type == "llama3":
            try:
                kwargs = {
                    "factor": float(params["factor"]),
                    "low_freq_factor": float(params["low_freq_factor"]),
                    "high_freq_factor": float(params["high_freq_factor"]),
                    "original_max_position": int(params["original_max_position_embeddings"]),
                }
            except (KeyError, TypeError, ValueError) as exc:
                raise RopeConfigError(f"llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                                      f"original_max_position_embeddings ({exc!s} missing or invalid)") from None
        elif rope_type == "linear":
            try:
                kwargs = {"factor": float(params["factor"])}
            except (KeyError, TypeError, ValueError):
                raise RopeConfigError("linear rope scaling needs a numeric factor") from None
        return cls(head_dim=head_dim, rotary_dim=rotary_dim, base=base, rope_type=rope_type, **kwargs)

    def inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor:
        """float32 [rotary_dim / 2], computed as the engine computes it."""
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=device) / self.rotary_dim
        inv = 1.0 / (self.base**exponents)
        if self.rope_type == "llama3":
            low_wavelen = self.original_max_position / self.low_freq_factor
            high_wavelen = self.original_max_position / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            if self.low_freq_factor != self.high_freq_factor:
                smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
                    self.high_freq_factor - self.low_freq_factor
                )
            else:
                smooth = torch.zeros_like(inv)
            blended = (1 - smooth) * inv / self.factor + smooth * inv
            inv = torch.where(wavelen < high_wavelen, inv, torch.where(wavelen > low_wavelen, inv / self.factor, blended))
        return inv

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin [tokens, rotary_dim / 2] of the engine's angles at `positions`."""
        t = positions.to(torch.float32)
        if self.rope_type == "linear":
            t = t / self.factor
        angles = t[:, None] * self.inv_freq(positions.device)[None, :]
        return angles.cos(), angles.sin()


def _rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        if all(isinstance(v, Mapping) for v in params.values()):
            raise RopeConfigError(
                f"RoPE per layer type ({', '.join(params)}) is not supported: layers would need their own re-rotation"
            )
        return params
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping):
        return scaling
    if scaling is not None:
        raise RopeConfigError(f"rope_scaling must be a mapping, got {scaling!r}")
    return {}


def _unsupported(rope_type: str) -> str:
    why = _WHY_NOT.get(rope_type, "not one this server can re-rotate exactly")
    return f"RoPE type {rope_type!r} is not supported for KV blending: {why} (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"


def _as_positions(value: torch.Tensor | int | Any, n_tokens: int, device: torch.device) -> torch.Tensor:
    positions = torch.as_tensor(value, dtype=torch.long, device=device)
    if positions.dim() == 0:
        positions = positions.expand(n_tokens)
    if positions.shape != (n_tokens,):
        raise ValueError(f"positions must be one per token ({n_tokens}), got shape {tuple(positions.shape)}")
    if bool((positions < 0).any()):
        raise ValueError("positions must not be negative")
    return positions


def rerotate(
    k: torch.Tensor,
    from_positions: torch.Tensor | int,
    to_positions: torch.Tensor | int,
    spec: RopeSpec,
) -> torch.Tensor:
    """K (rotated by the engine at `from_positions`) as the engine would have rotated it at
    `to_positions`. `k` is [tokens, kv_heads, head_dim] or [tokens, kv_heads x head_dim]; the
    positions are one per token, or one int for all. Computes in float32 and returns K's dtype,
    on K's device; `k` itself is not changed."""
    _check_shape(k, spec)
    return apply_rerotation(k, rerotation(from_positions, to_positions, spec, k.shape[0], k.device), spec)


def rerotation(
    from_positions: torch.Tensor | int, to_positions: torch.Tensor | int, spec: RopeSpec, n_tokens: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 cos/sin that move K from `from_positions` to `to_positions` (the angle
    difference, computed in float64): once per prompt, then applied to every layer's K."""
    device = torch.device(device)
    src = _as_positions(from_positions, n_tokens, device)
    dst = _as_positions(to_positions, n_tokens, device)
    cos_p, sin_p = (x.double() for x in spec.cos_sin(src))
    cos_q, sin_q = (x.double() for x in spec.cos_sin(dst))
    return (cos_q * cos_p + sin_q * sin_p).float(), (sin_q * cos_p - cos_q * sin_p).float()


def apply_rerotation(k: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor], spec: RopeSpec) -> torch.Tensor:
    """`rerotate` with the cos/sin of `rerotation` (one row per token of `k`)."""
    _check_shape(k, spec)
    cos, sin = rotation
    if cos.shape[0] != k.shape[0]:
        raise ValueError(f"a rotation for {cos.shape[0]} tokens applied to K of {k.shape[0]}")
    return _apply(k, cos, sin, spec)


def rotate(x: torch.Tensor, positions: torch.Tensor | int, spec: RopeSpec) -> torch.Tensor:
    """RoPE applied to unrotated `x` at `positions`, as the engine's forward does (float32 cos/sin):
    the reference the tests compare a re-rotation with, and what a recompute path needs."""
    _check_shape(x, spec)
    cos, sin = spec.cos_sin(_as_positions(positions, x.shape[0], x.device))
    return _apply(x, cos, sin, spec)


def _check_shape(k: torch.Tensor, spec: RopeSpec) -> None:
    fits = k.shape[-1] % spec.head_dim == 0 if k.dim() == 2 else k.dim() == 3 and k.shape[-1] == spec.head_dim
    if not fits:
        raise ValueError(
            f"K must be [tokens, heads, {spec.head_dim}] or [tokens, heads x {spec.head_dim}], got shape {tuple(k.shape)}"
        )


def _apply(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Neox rotation of each head's first rotary_dim dimensions by float32 cos/sin [tokens, rotary_dim / 2]."""
    heads = k.reshape(k.shape[0], -1, spec.head_dim)
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = spec.rotary_dim // 2
    rot = heads[..., : spec.rotary_dim].float()
    x1, x2 = rot[..., :half], rot[..., half:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(k.dtype)
    if spec.rotary_dim < spec.head_dim:
        rotated = torch.cat((rotated, heads[..., spec.rotary_dim :]), dim=-1)
    return rotated.reshape(k.shape)
