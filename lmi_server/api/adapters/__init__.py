"""LoRA adapters over HTTP: management routes, per-request resolution (the pipeline's resolve
stage) and wiring of the registry into the app."""
