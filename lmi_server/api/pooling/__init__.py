"""pooling front door."""
