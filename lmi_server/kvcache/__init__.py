"""LMCache integration: config translation, auto-planning, and the supervised cache server."""
