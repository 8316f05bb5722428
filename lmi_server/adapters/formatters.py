"""Formatters in a `model.py`, in the model directory (for every request) or in an adapter's
directory (for that adapter's requests; per direction, the adapter's replaces the model's).

Two contracts, told apart by how a function is found, never by guessing at its behaviour:

LMI's (functions marked with `djl_python`'s decorators, as LMI's documented files are written):
    @input_formatter  def f(payload: dict, **kwargs) -> dict
        the decoded JSON body, before the request's schema is detected (so a deployment may
        accept its own body shape), with `tokenizer=`; returns the body to serve.
    @output_formatter def g(response) -> Any
        vLLM's response object (CompletionResponse / ChatCompletionResponse; for a stream each
        chunk object); what it returns is what is sent (pydantic models and dicts as JSON).

The text contract (plain functions named `input_formatter` / `output_formatter`, adapters only):
    def input_formatter(request, context) -> request | None
        `request` is the parsed request: an `LMIRequest` (LMI schema: `.inputs`, `.parameters`)
        or vLLM's `ChatCompletionRequest` (`.messages`) / `CompletionRequest` (`.prompt`).
        Change it in place and return None, or return a replacement of the same type.
    def output_formatter(text, context) -> str
        `text` is generated text on its way back to the client; return the text to send.
        Non-streaming responses: called once per choice / generated_text with context.final=True.
        Streaming responses: called once per streamed piece (an SSE delta or a jsonlines token)
        with context.final=False, and for LMI's closing line (the whole text) with final=True.
    Either may take just one argument (the request / the text). `context` is a
    `FormatterContext`: adapter name, schema ("lmi" | "chat" | "completion"), stream flag, final
    flag, the parsed request.

Each script is imported in its own namespace (a unique module name per adapter and load), so two
adapters' `model.py` never see each other's globals; its own directory is on `sys.path` while it
imports, so it can import the helper modules beside it. A script that fails to import makes its
adapter's registration fail with `FormatterInvalid` (a `FormatterError`; registering it is a
400, requests for it get 424); a model-level script that fails stops the start-up.
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
# djl_python's decorators set these attributes (djl_python/input_parser.py, output_formatter.py).
LMI_INPUT_MARK = "is_input_formatter"
LMI_OUTPUT_MARK = "is_output_formatter"
UNSUPPORTED_MARKS = {
    "is_init_handler": "@init_handler (custom model loading)",
    "is_prediction_handler": "@prediction_handler (custom prediction)",
}
UNSUPPORTED_NAMES = {
    "model_fn": "model_fn() (a SageMaker inference script)",
    "predict_fn": "predict_fn() (a SageMaker inference script)",
    "input_fn": "input_fn() (a SageMaker inference script)",
    "output_fn": "output_fn() (a SageMaker inference script)",
}


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


def _accepts_keyword(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD or (p.name == name and p.kind != p.POSITIONAL_ONLY) for p in params)


@dataclass
class Formatters:
    """One script's formatters: `input`/`output` of the text contract, `payload_input` /
    `response_output` of LMI's (see the module docstring)."""

    module_name: str | None = None
    input: Callable | None = None
    output: Callable | None = None
    payload_input: Callable | None = None
    response_output: Callable | None = None
    handler: Callable | None = None  # LMI's custom `async def handle(inputs)` (model level only)
    owner: str = "adapter"  # who the script belongs to, for messages: "adapter 'x'" or "model"
    _in_arity: int = 2
    _out_arity: int = 2

    @property
    def empty(self) -> bool:
        return not (self.input or self.output or self.payload_input or self.response_output or self.handler)

    @property
    def has_input(self) -> bool:
        return self.input is not None or self.payload_input is not None

    @property
    def has_output(self) -> bool:
        return self.output is not None or self.response_output is not None

    def format_payload(self, payload: Any, *, tokenizer: Any = None) -> Any:
        """LMI's input formatter on the decoded body; its result must be a JSON object (dict)."""
        fn = self.payload_input
        if fn is None:
            return payload
        try:
            result = fn(payload, tokenizer=tokenizer) if _accepts_keyword(fn, "tokenizer") else fn(payload)
        except Exception as exc:  # noqa: BLE001 - the script's own failure, reported to the client
            raise FormatterError(f"input formatter of {self.owner} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, dict):
            raise FormatterError(
                f"input formatter of {self.owner} returned {type(result).__name__}; it must return the "
                'request body as a dict (e.g. {"inputs": "...", "parameters": {...}})'
            )
        return result

    def format_response(self, response: Any) -> Any:
        """LMI's output formatter on vLLM's response object (or one stream chunk)."""
        try:
            return self.response_output(response)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001
            raise FormatterError(f"output formatter of {self.owner} failed: {type(exc).__name__}: {exc}") from exc

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


def _import_script(label: str, script: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise FormatterInvalid(f"{label}: cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    folder = str(script.parent)
    sys.path.insert(0, folder)  # helper modules beside model.py, as LMI imports them
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, ImportError, SystemExit...: all are the script's fault
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (line {last[0].lineno})" if last and last[0].filename == str(script) else ""
        if isinstance(exc, SyntaxError):
            where = f" (line {exc.lineno})"
        raise FormatterInvalid(f"{label}: {script.name} failed to import{where}: {type(exc).__name__}: {exc}") from None
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    # Not left in sys.modules: nothing else can import it, and deleting the adapter frees it.
    sys.modules.pop(name, None)
    return module


def _marked(module, mark: str) -> Callable | None:
    found = [v for v in vars(module).values() if callable(v) and getattr(v, mark, False) is True]
    own = [v for v in found if getattr(v, "__module__", None) == module.__name__]
    return (own or found or [None])[-1]


def _refuse_unsupported(label: str, script: Path, module, *, model_level: bool = False) -> None:
    for mark, what in UNSUPPORTED_MARKS.items():
        if _marked(module, mark) is not None:
            raise FormatterInvalid(
                f"{label}: {script.name} defines {what}; this server always serves with vLLM: "
                "keep @input_formatter / @output_formatter only"
            )
    has_formatter = _marked(module, LMI_INPUT_MARK) or _marked(module, LMI_OUTPUT_MARK)
    handler = getattr(module, "handle", None)
    if callable(handler) and not model_level:
        raise FormatterInvalid(
            f"{label}: {script.name} defines handle(); a custom handler belongs in the model directory's "
            "model.py (an adapter's model.py may define @input_formatter / @output_formatter)"
        )
    if callable(handler) and not inspect.iscoroutinefunction(handler):
        raise FormatterInvalid(f"{label}: {script.name} defines handle() but not as `async def handle(inputs)`; LMI runs it async")
    has_formatter = has_formatter or callable(handler)
    for attr, what in UNSUPPORTED_NAMES.items():
        if not has_formatter and callable(getattr(module, attr, None)):
            raise FormatterInvalid(
                f"{label}: {script.name} defines {what}, which this server does not run; write "
                "@input_formatter / @output_formatter functions (from djl_python) instead"
            )


def _text_contract(module, name: str) -> Callable | None:
    fn = getattr(module, name, None)
    if not callable(fn) or getattr(fn, LMI_INPUT_MARK, False) or getattr(fn, LMI_OUTPUT_MARK, False):
        return None
    if getattr(fn, "__module__", None) != module.__name__:
        return None  # a decorator imported by name (`from djl_python... import output_formatter`)
    return fn


def load_formatters(adapter: str, adapter_dir: Path) -> Formatters:
    """Import adapter_dir/model.py in its own namespace; no script -> empty Formatters."""
    script = adapter_dir / "model.py"
    if not script.is_file():
        return Formatters()
    label = f"adapter {adapter!r}"
    name = unique_module_name(adapter, adapter_dir)
    module = _import_script(label, script, name)
    _refuse_unsupported(label, script, module)
    payload_in, response_out = _marked(module, LMI_INPUT_MARK), _marked(module, LMI_OUTPUT_MARK)
    fin = None if payload_in else _text_contract(module, "input_formatter")
    fout = None if response_out else _text_contract(module, "output_formatter")
    found = Formatters(
        module_name=name, input=fin, output=fout, payload_input=payload_in, response_output=response_out,
        owner=label, _in_arity=_arity(fin) if fin else 2, _out_arity=_arity(fout) if fout else 2,
    )
    if found.empty:
        raise FormatterInvalid(
            f"{label}: {script.name} defines neither input_formatter nor output_formatter "
            "(mark functions with djl_python's @input_formatter / @output_formatter)"
        )
    return found


def load_model_formatters(model_dir: Path | None) -> Formatters:
    """The model directory's model.py (LMI's contract only); no script -> empty Formatters."""
    if model_dir is None or not (model_dir / "model.py").is_file():
        return Formatters(owner="the model")
    script = model_dir / "model.py"
    label = f"model directory {str(model_dir)!r}"
    name = unique_module_name("model", model_dir)
    module = _import_script(label, script, name)
    _refuse_unsupported(label, script, module, model_level=True)
    handler = getattr(module, "handle", None)
    found = Formatters(
        module_name=name, payload_input=_marked(module, LMI_INPUT_MARK),
        response_output=_marked(module, LMI_OUTPUT_MARK), owner="the model",
        handler=handler if callable(handler) else None,
    )
    if found.empty:
        raise FormatterInvalid(
            f"{label}: {script.name} marks no function with @input_formatter / @output_formatter "
            "(from djl_python.input_parser / djl_python.output_formatter) and defines no async handle()"
        )
    return found
