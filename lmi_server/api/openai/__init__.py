"""OpenAI's front door: chat and completions (through the pipeline), models, vLLM's render API."""
