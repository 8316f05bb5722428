"""Local scale-out cluster recipe (see deploy/README.md)."""
