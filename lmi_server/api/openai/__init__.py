"""openai front door."""
