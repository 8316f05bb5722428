"""Per-adapter formatters: an adapter directory's `model.py` may define

    def input_formatter(request, context) -> request | None
        `request` is the parsed request: an `LMIRequest` (LMI schema: `.inputs`, `.parameters`)
        or vLLM's `ChatCompletionRequest` (`.messages`) / `CompletionRequest` (`.prompt`).
        Change it in place and return None, or return a replacement of the same type.

    def output_formatter(text, context) -> str
        `text` is generated text on its way back to the client; return the text to send.
        Non-streaming responses: called once per choice / generated_text with context.final=True.
        Streaming responses: called once per streamed piece (an SSE delta or a jsonlines token)
        with context.final=False, and for LMI's closing line (the whole text) with final=True.

Either may take just one argument (the request / the text). Instead of the plain names, any
function may be marked with the decorators of this module (`from lmi_server.adapters.formatters
import input_formatter, output_formatter`), as in LMI. `context` is a `FormatterContext`:
adapter name, schema ("lmi" | "chat" | "completion"), stream flag, final flag, the parsed request.

Each script is imported in its own namespace (a unique module name per adapter and load), so two
adapters' `model.py` never see each other's globals. A script that fails to import makes its
adapter's registration fail with `FormatterInvalid` (a `FormatterError`; registering it is a
400, requests for it get 424).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_SEQ = itertools.count(1)
_INPUT_MARK = "__lmi_input_formatter__"
_OUTPUT_MARK = "__lmi_output_formatter__"


def input_formatter(fn: Callable) -> Callable:
    """Mark fn as the adapter's input formatter."""
    setattr(fn, _INPUT_MARK, True)
    return fn


def output_formatter(fn: Callable) -> Callable:
    """Mark fn as the adapter's output formatter."""
    setattr(fn, _OUTPUT_MARK, True)
    return fn


class FormatterError(Exception):
    """A formatter script that cannot be imported, or a formatter that raised."""


class FormatterInvalid(FormatterError):
    """A formatter script that cannot be imported or defines no formatter (at registration)."""


@dataclass
class FormatterContext:
    adapter: str
    schema: str  # lmi | chat | completion
    stream: bool = False
    final: bool = True
    request: Any = None


def _arity(fn: Callable) -> int:
    try:
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.kind == p.VAR_POSITIONAL
        ]
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    return min(len(params), 2)


@dataclass
class Formatters:
    module_name: str | None = None
    input: Callable | None = None
    output: Callable | None = None
    _in_arity: int = 2
    _out_arity: int = 2

    @property
    def empty(self) -> bool:
        return self.input is None and self.output is None

    def format_input(self, request: Any, ctx: FormatterContext) -> Any:
        if self.input is None:
            return request
        try:
            result = self.input(request, ctx) if self._in_arity >= 2 else self.input(request)
        except Exception as exc:  # noqa: BLE001 - the script's own failure, reported to the client
            raise FormatterError(f"input_formatter of adapter {ctx.adapter!r} failed: {type(exc).__name__}: {exc}") from exc
        return request if result is None else result

    def format_output(self, text: str, ctx: FormatterContext) -> str:
        if self.output is None:
            return text
        try:
            result = self.output(text, ctx) if self._out_arity >= 2 else self.output(text)
        except Exception as exc:  # noqa: BLE001
            raise FormatterError(f"output_formatter of adapter {ctx.adapter!r} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, str):
            raise FormatterError(
                f"output_formatter of adapter {ctx.adapter!r} returned {type(result).__name__}; it must return str"
            )
        return result


def unique_module_name(adapter: str, path: Path) -> str:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() else "_" for c in adapter)
    return f"lmi_adapter_formatters.{safe}_{digest}_{next(_SEQ)}"


def load_formatters(adapter: str, adapter_dir: Path) -> Formatters:
    """Import adapter_dir/model.py in its own namespace; no script -> empty Formatters."""
    script = adapter_dir / "model.py"
    if not script.is_file():
        return Formatters()
    name = unique_module_name(adapter, adapter_dir)
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise FormatterInvalid(f"adapter {adapter!r}: cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, ImportError, SystemExit...: all are the script's fault
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (line {last[0].lineno})" if last and last[0].filename == str(script) else ""
        if isinstance(exc, SyntaxError):
            where = f" (line {exc.lineno})"
        raise FormatterInvalid(f"adapter {adapter!r}: {script.name} failed to import{where}: {type(exc).__name__}: {exc}") from None
    # Not left in sys.modules: nothing else can import it, and deleting the adapter frees it.
    sys.modules.pop(name, None)
    fin = fout = None
    for value in vars(module).values():
        if callable(value) and getattr(value, _INPUT_MARK, False):
            fin = value
        if callable(value) and getattr(value, _OUTPUT_MARK, False):
            fout = value
    fin = fin or (getattr(module, "input_formatter", None) if callable(getattr(module, "input_formatter", None)) else None)
    fout = fout or (getattr(module, "output_formatter", None) if callable(getattr(module, "output_formatter", None)) else None)
    # The decorators themselves, if imported by name, are not formatters.
    if fin is input_formatter:
        fin = None
    if fout is output_formatter:
        fout = None
    if fin is None and fout is None:
        raise FormatterInvalid(
            f"adapter {adapter!r}: {script.name} defines neither input_formatter nor output_formatter"
        )
    return Formatters(
        module_name=name,
        input=fin,
        output=fout,
        _in_arity=_arity(fin) if fin else 2,
        _out_arity=_arity(fout) if fout else 2,
    )
