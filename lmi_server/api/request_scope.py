"""The request's scope: its context created first, its hold on the server's resources ended last.

`RequestScopeMiddleware` (the outermost middleware) creates the request's context
(`api/context.py`) and, when the response is over however it ended (client gone, error,
cancellation), releases the adapter lease and then the admission ticket; it adds the headers the
request collected on its way (the tenant's rate-limit headers) to the response.
"""

from __future__ import annotations

from lmi_server.api.context import request_context


class RequestScopeMiddleware:
    """Outermost: every request gets its context; when its response is over, its adapter lease and
    admission ticket are released, and the headers it collected are added to the response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = request_context(scope)

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and ctx.response_headers:
                present = {k.lower() for k, _ in message.get("headers", [])}
                added = [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in ctx.response_headers.items()
                    if k.encode("latin-1") not in present
                ]
                message = {**message, "headers": list(message.get("headers", [])) + added}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            try:
                if ctx.adapter is not None and ctx.adapter.lease is not None:
                    await ctx.adapter.lease.release()
            finally:
                if ctx.ticket is not None:
                    ctx.ticket.release()
