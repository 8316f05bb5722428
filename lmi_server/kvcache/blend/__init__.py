"""KV reuse beyond the prefix (CacheBlend): segments and their position-independent keys
(`segments`), exact RoPE re-rotation of cached K (`rope`), the choice of tokens to recompute and
attention over blended KV (`recompute`), the blended prefill over a model's own modules
(`forward`), token-granular copies to and from vLLM's CPU paged KV cache (`paged`), which models
it can handle (`support`) and its settings (`settings`); the engine integration: the scheduler's
decisions (`scheduling`), the worker's blends and stores (`worker`) and the segment store
(`store`), called from `lmi_server/kvcache/connector.py`. See DESIGN.md in this folder."""
