"""Formatters in a `model.py`, in the model directory (for every request) or in an adapter's
directory (for that adapter's requests; per direction, the adapter's replaces the model's).

One contract, LMI's: functions marked with `djl_python`'s decorators, as LMI's documented files
are written.
    @input_formatter  def f(payload: dict, **kwargs) -> dict
        the decoded JSON body, before the request's schema is detected (so a deployment may
        accept its own body shape), with `tokenizer=`; returns the body to serve.
    @output_formatter def g(response) -> Any
        vLLM's response object (CompletionResponse / ChatCompletionResponse); for a stream, each
        chunk as vLLM yields it, the string `'data: {...}\\n\\n'`. What it returns is sent as it
        is (pydantic models and dicts as JSON; one line per chunk). A formatter that returns the
        same kind of thing it got (the response object, or a `data:` chunk string) edits vLLM's
        output in place: the server then still shapes it for the request's schema (LMI's
        `generated_text` and token lines, OpenAI's choices), which is how an adapter changes only
        the text. Every front door shows it one of these shapes: /v1/messages hands it vLLM's chat
        answer before rendering the Messages answer from it, /v1/responses its text as a chat
        answer (api/responses/formatting.py), so a formatter written for chat works on every door.
    async def handle(inputs: Input) (the model directory's model.py only): LMI's custom handler,
        which sees each /invocations request first (see lmi_server/api/sagemaker/custom_handler.py).
The `(text, context)` functions of earlier versions are retired: an unmarked `input_formatter` /
`output_formatter` is refused with a message that says how to mark it.

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


def _accepts_keyword(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD or (p.name == name and p.kind != p.POSITIONAL_ONLY) for p in params)


@dataclass
class Formatters:
    """One script's formatters (see the module docstring)."""

    module_name: str | None = None
    payload_input: Callable | None = None
    response_output: Callable | None = None
    handler: Callable | None = None  # LMI's custom `async def handle(inputs)` (model level only)
    owner: str = "adapter"  # who the script belongs to, for messages: "adapter 'x'" or "the model"

    @property
    def empty(self) -> bool:
        return not (self.payload_input or self.response_output or self.handler)

    @property
    def has_input(self) -> bool:
        return self.payload_input is not None

    @property
    def has_output(self) -> bool:
        return self.response_output is not None

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
        """LMI's output formatter on vLLM's response object (or one raw stream chunk)."""
        try:
            return self.response_output(response)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001
            raise FormatterError(f"output formatter of {self.owner} failed: {type(exc).__name__}: {exc}") from exc


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


def _refuse_retired(label: str, script: Path, module) -> None:
    """Unmarked `input_formatter` / `output_formatter` functions: the retired text contract."""
    for name, decorator in (("input_formatter", "@input_formatter (djl_python.input_parser)"),
                            ("output_formatter", "@output_formatter (djl_python.output_formatter)")):
        fn = getattr(module, name, None)
        if not callable(fn) or getattr(fn, LMI_INPUT_MARK, False) or getattr(fn, LMI_OUTPUT_MARK, False):
            continue
        if getattr(fn, "__module__", None) != module.__name__:
            continue  # the decorator itself, imported by name
        raise FormatterInvalid(
            f"{label}: {script.name} defines {name}() without a decorator; mark it with {decorator}. "
            "Formatters follow LMI's contract: the input formatter gets the request body (a dict), the "
            "output formatter vLLM's response object or each raw stream chunk ('data: {...}')"
        )


def load_formatters(adapter: str, adapter_dir: Path) -> Formatters:
    """Import adapter_dir/model.py in its own namespace; no script -> empty Formatters."""
    script = adapter_dir / "model.py"
    if not script.is_file():
        return Formatters()
    label = f"adapter {adapter!r}"
    name = unique_module_name(adapter, adapter_dir)
    module = _import_script(label, script, name)
    _refuse_unsupported(label, script, module)
    _refuse_retired(label, script, module)
    found = Formatters(
        module_name=name, payload_input=_marked(module, LMI_INPUT_MARK), response_output=_marked(module, LMI_OUTPUT_MARK),
        owner=label,
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
    _refuse_retired(label, script, module)
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
