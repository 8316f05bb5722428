"""HTTP layer: thin FastAPI routers over the engine and vLLM's serving objects."""
