"""KV reuse beyond the prefix (CacheBlend): segments and their position-independent keys
(`segments`), exact RoPE re-rotation of cached K (`rope`), the choice of tokens to recompute and
attention over blended KV (`recompute`), which models it can handle (`support`) and its
settings (`settings`). Written in torch only, so CPU and CUDA share them. The engine-side
integration is not built yet: see DESIGN.md in this folder. `paged` copies single tokens
to and from vLLM's CPU paged KV cache (K re-rotated); `forward` is the blended prefill over a
model's own modules."""
