"""LoRA adapters: one lazy registry, per-adapter formatters."""
