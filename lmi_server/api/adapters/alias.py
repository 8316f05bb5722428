"""SageMaker's adapter alias (`X-Amzn-SageMaker-Adapter-Alias`): the name its answers speak of.

Why: SageMaker calls the adapter API and sends requests with its own adapter identifier (the
`name`, and `X-Amzn-SageMaker-Adapter-Identifier`), and sends the adapter's human-facing name
beside it in this header. AWS's model-hosting-container-standards and LMI both word the
management answers and the "not found" errors with the alias when one is given, the name
otherwise ("Adapter {alias} registered", "The adapter {alias} was not found"), so that the
message a SageMaker user reads names the adapter component they created.
"""

from __future__ import annotations

from fastapi import Request

from lmi_server.api.standards import ALIAS_HEADER


def alias_of(request: Request) -> str | None:
    """The alias header's value, or None when it is absent or empty."""
    value = (request.headers.get(ALIAS_HEADER) or "").strip()
    return value or None


def shown(request: Request, name: str) -> str:
    """What answers call the adapter: its alias when the request gives one, else its name."""
    return alias_of(request) or name


def not_found(request: Request, name: str) -> str:
    return f"The adapter {shown(request, name)} was not found"
