"""adapters front door."""
