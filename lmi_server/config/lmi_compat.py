"""LMI's configuration as LMI reads it.

Every environment variable, top-level key and `option.*` key that LMI documents for its vLLM
backend (or that its code reads) is listed in `lmi_keys.json` with what it does here: mapped onto
one of this server's keys, read from the environment as it is, accepted as not applicable (one log
line with the reason), or refused (a start-up error with the reason). This module applies that
list; it is pure (no environment writes, no vLLM import) so that config tests need no engine.
Unknown keys are left for the schema, which refuses them by name.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

Here = Literal["mapped", "environment", "not-applicable", "refused"]

# kv_connector names of LMCache's vLLM connectors: they switch on this server's own LMCache wiring.
LMCACHE_CONNECTORS = {"LMCacheConnectorV1", "LMCacheConnectorV1Dynamic", "LMCacheMPConnector"}
# LMI's option.task -> vLLM's runner / convert (LMI's own translation of its task names).
TASK_RUNNER_CONVERT: dict[str, dict[str, str]] = {
    "auto": {},
    "generate": {"runner": "generate"},
    "text-generation": {"runner": "generate"},
    "text-embedding": {"convert": "embed"},
    "classify": {"convert": "classify"},
    "feature-extraction": {"runner": "pooling", "convert": "embed"},
}
LMI_DEFAULT_MAX_LORAS = 4
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@dataclass(frozen=True)
class LmiKey:
    """One entry of `lmi_keys.json`: what LMI means by a name and what it does here."""

    name: str
    kind: Literal["env", "option", "top-level"]
    meaning: str
    lmi: str  # where LMI documents or reads it
    here: Here
    to: str | None = None  # mapped: what it becomes here
    why: str | None = None  # not applicable / refused / environment: the reason
    note: str | None = None
    alias: str | None = None  # an LMI option name of a vLLM engine argument
    transform: Literal["negate", "mib_to_bytes"] | None = None
    accepted_values: list[str] | None = None  # other values are refused with refused_why
    refused_values: list[str] | None = None
    refused_why: str | None = None
    example: str | None = None  # a value the tests (and the README) use
    example_with: dict[str, str] | None = None  # properties the example needs beside it

    @property
    def key(self) -> str:
        """The name as this server matches it: option keys lower-cased, top-level keys lower-cased."""
        return self.name if self.kind == "env" else self.name.lower()

    def refusal(self, value: str) -> str | None:
        """The reason a value is refused, or None."""
        v = value.strip().lower()
        if self.here == "refused":
            return self.why
        if self.accepted_values is not None and v not in self.accepted_values:
            return self.refused_why
        if self.refused_values is not None and v in self.refused_values:
            return self.refused_why
        return None


@lru_cache(maxsize=1)
def lmi_keys() -> tuple[LmiKey, ...]:
    entries = json.loads(Path(__file__).with_name("lmi_keys.json").read_text(encoding="utf-8"))
    return tuple(LmiKey(**e) for e in entries)


@lru_cache(maxsize=None)
def keys_of(kind: str) -> dict[str, LmiKey]:
    """Entries of one kind by the name this server matches (option keys without `option.`)."""
    out: dict[str, LmiKey] = {}
    for k in lmi_keys():
        if k.kind == kind:
            out[k.key[len("option."):] if kind == "option" else k.key] = k
    return out


def lmi_aliases() -> dict[str, str]:
    """LMI option name -> vLLM engine-argument name."""
    return {name: k.alias for name, k in keys_of("option").items() if k.alias}


def not_applicable_options() -> dict[str, str]:
    return {name: k.why or "" for name, k in keys_of("option").items() if k.here == "not-applicable"}


def parse_bool(text: str) -> bool:
    v = text.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError("expected true or false")


def _transform(entry: LmiKey, value: str) -> str:
    if entry.transform == "negate":
        return "false" if parse_bool(value) else "true"
    if entry.transform == "mib_to_bytes":
        try:
            mib = int(value.strip())
        except ValueError:
            raise ValueError("expected a whole number of MiB") from None
        return str(mib * 1024 * 1024)
    return value


# Read with the properties, not alone: LMI reads it only for its kv_transfer_config recipe.
_READ_WITH_PROPERTIES = {"LMCACHE_CONFIG_FILE"}


@dataclass
class EnvironmentReading:
    """What the environment says, as LMI reads it."""

    props: dict[str, str] = field(default_factory=dict)  # option.* and top-level keys
    not_applicable: dict[str, str] = field(default_factory=dict)  # variable -> why
    translated: dict[str, str] = field(default_factory=dict)  # variable -> what it became
    problems: list[str] = field(default_factory=list)


def read_environment(environ: Mapping[str, str]) -> EnvironmentReading:
    """OPTION_FOO -> option.foo; SERVING_<KEY> -> top-level key; LMI's named variables (HF_*,
    TENSOR_PARALLEL_DEGREE, MAX_BATCH_SIZE, SAGEMAKER_*, ...) in the order of the data, an explicit
    OPTION_* (or an earlier variable) winning, as LMI's start-up script does."""
    out = EnvironmentReading()
    for name, value in environ.items():
        if name.startswith("OPTION_") and len(name) > len("OPTION_"):
            out.props["option." + name[len("OPTION_"):].lower()] = value
    named, top = keys_of("env"), keys_of("top-level")
    for name, value in environ.items():
        if name.startswith("SERVING_") and name not in named:
            key = name[len("SERVING_"):].lower()
            if key in top:
                out.props.setdefault(key, value)
            else:
                close = difflib.get_close_matches(name, [n for n in named if n.startswith("SERVING_")]
                                                  + ["SERVING_" + k.upper() for k in top], n=1, cutoff=0.7)
                hint = f" (did you mean {close[0]}?)" if close else ""
                out.problems.append(f"{name}: unknown DJL Serving setting{hint}")
    for name, entry in named.items():
        value = environ.get(name)
        if not value or name in _READ_WITH_PROPERTIES:  # LMI skips empty variables
            continue
        refused = entry.refusal(value)
        if refused:
            out.problems.append(f"{name}={value!r}: {refused}")
        elif entry.here == "mapped":
            target = entry.to or ""
            if target in out.props:
                out.translated[name] = f"not used: {target} is already set ({out.props[target]!r})"
                continue
            try:
                out.props[target] = _transform(entry, value)
            except ValueError as exc:
                out.problems.append(f"{name}={value!r}: {exc}")
                continue
            out.translated[name] = f"{target}={out.props[target]}"
        elif entry.here == "environment":
            out.translated[name] = entry.why or ""
        else:
            out.not_applicable[name] = entry.why or ""
    for name in environ:
        if name.startswith("SAGEMAKER_") and name not in named:
            out.not_applicable[name] = "not a setting LMI's vLLM backend reads; not read by this server"
    return out


@dataclass
class Translation:
    """Merged properties with LMI's own keys turned into this server's."""

    props: dict[str, str]
    not_applicable: dict[str, str] = field(default_factory=dict)
    translated: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    engine_args: dict[str, Any] = field(default_factory=dict)  # given to vLLM as they are


def translate_properties(properties: Mapping[str, str], environ: Mapping[str, str] | None = None) -> Translation:
    """Apply the data to merged properties. Keys LMI does not document stay for the schema to refuse."""
    environ = environ or {}
    out = Translation(props={})
    options, top = keys_of("option"), keys_of("top-level")
    special: dict[str, str] = {}
    for full_key, raw in properties.items():
        if not full_key.startswith("option."):
            _top_level(full_key, raw, top, properties, out)
            continue
        name = full_key[len("option."):].lower()
        entry = options.get(name)
        if entry is None:
            out.props[full_key] = raw
            continue
        refused = entry.refusal(raw)
        if refused:
            out.problems.append(f"{full_key}={raw!r}: {refused}")
        elif name in _SPECIAL:
            special[name] = full_key
        elif entry.here == "not-applicable":
            out.not_applicable[full_key] = entry.why or ""
        elif name == "quantize" and raw.strip().lower() in ("bitsandbytes8", "bitsandbytes4"):
            out.props[full_key] = "bitsandbytes"
            out.translated[full_key] = "option.quantization=bitsandbytes (LMI's bitsandbytes8/4 names)"
        else:
            out.props[full_key] = raw
    for name, full_key in special.items():
        _SPECIAL[name](full_key, properties[full_key], properties, environ, out)
    if "kv_transfer_config" not in special and environ.get("LMCACHE_CONFIG_FILE"):
        out.not_applicable["LMCACHE_CONFIG_FILE"] = (
            "LMCache is not switched on: LMI reads it only with option.kv_transfer_config naming an LMCache "
            "connector; use option.lmcache_config_file"
        )
    return out


def _top_level(full_key: str, raw: str, top: dict[str, LmiKey], properties: Mapping[str, str], out: Translation) -> None:
    entry = top.get(full_key.lower())
    if entry is None:
        out.props[full_key] = raw  # the schema refuses it by name
        return
    refused = entry.refusal(raw)
    if refused:
        out.problems.append(f"{full_key}={raw!r}: {refused}")
    elif entry.here == "mapped":
        target = entry.to or ""
        if target in properties:
            out.translated[full_key] = f"not used: {target}={properties[target]!r} is set and wins"
        else:
            out.props[target] = raw
            out.translated[full_key] = f"{target}={raw}"
    else:
        out.not_applicable[full_key] = entry.why or ""


def _engine(full_key: str, raw: str, properties: Mapping[str, str], environ: Mapping[str, str], out: Translation) -> None:
    """OPTION_ENGINE is LMI's top-level `engine`."""
    if "engine" in properties:
        out.translated[full_key] = f"not used: engine={properties['engine']!r} is set"
        return
    _top_level("engine", raw, keys_of("top-level"), properties, out)


def _task(full_key: str, raw: str, properties: Mapping[str, str], environ: Mapping[str, str], out: Translation) -> None:
    task = raw.strip().lower().replace("_", "-")  # text_embedding is text-embedding, as users write both
    wanted = TASK_RUNNER_CONVERT.get(task)
    if wanted is None:
        out.translated[full_key] = f"{raw!r} is not one of LMI's vLLM tasks; vLLM picks the runner from the model, as in LMI"
        return
    done = []
    for arg, value in wanted.items():
        given = properties.get(f"option.{arg}")
        if given is not None and given.strip().lower() != value:
            done.append(f"option.{arg}={given} is set and wins over {value}")
        elif given is None:
            out.props[f"option.{arg}"] = value
            done.append(f"option.{arg}={value}")
    out.translated[full_key] = ", ".join(done) if done else "vLLM picks the runner from the model"


def _normalize(full_key: str, raw: str, properties: Mapping[str, str], environ: Mapping[str, str], out: Translation) -> None:
    try:
        normalize = parse_bool(raw)
    except ValueError as exc:
        out.problems.append(f"{full_key}={raw!r}: {exc}")
        return
    if normalize:
        out.translated[full_key] = "embeddings are normalized (vLLM's default too)"
        return
    text = out.props.get("option.pooler_config") or properties.get("option.pooler_config")
    try:
        pooler = json.loads(text) if text and text.strip().lower() not in ("none", "null") else {}
    except json.JSONDecodeError:
        return  # the schema reports the malformed option.pooler_config
    if not isinstance(pooler, dict):
        return
    pooler.setdefault("use_activation", False)
    out.props["option.pooler_config"] = json.dumps(pooler)
    out.translated[full_key] = f"option.pooler_config={out.props['option.pooler_config']} (no normalization)"


def _enable_reasoning(full_key: str, raw: str, properties: Mapping[str, str], environ: Mapping[str, str], out: Translation) -> None:
    try:
        enabled = parse_bool(raw)
    except ValueError as exc:
        out.problems.append(f"{full_key}={raw!r}: {exc}")
        return
    parser = properties.get("option.reasoning_parser")
    if enabled and not parser:
        out.problems.append(
            f"{full_key}={raw!r} needs option.reasoning_parser (as in LMI), e.g. option.reasoning_parser=deepseek_r1"
        )
    elif parser:
        out.translated[full_key] = f"reasoning on through option.reasoning_parser={parser} (vLLM has no separate switch)"
    else:
        out.translated[full_key] = "reasoning off (no option.reasoning_parser)"


def _kv_transfer_config(full_key: str, raw: str, properties: Mapping[str, str], environ: Mapping[str, str], out: Translation) -> None:
    """LMI's LMCache recipe switches on this server's LMCache wiring; other connectors go to vLLM."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        out.problems.append(f"{full_key}={raw!r}: expected JSON ({exc.msg} at column {exc.colno})")
        return
    if not isinstance(value, dict) or not value.get("kv_connector"):
        out.problems.append(f'{full_key}={raw!r}: expected a JSON object with "kv_connector", e.g. '
                            '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}')
        return
    connector = str(value["kv_connector"])
    ours = {k: properties[k] for k in ("option.lmcache_config_file", "option.lmcache_auto_config") if k in properties}
    if connector not in LMCACHE_CONNECTORS:
        if ours:
            out.problems.append(
                f"{full_key} names {connector}, while {', '.join(ours)} switches on LMCache's connector; keep one"
            )
            return
        out.engine_args["kv_transfer_config"] = value
        out.translated[full_key] = f"given to vLLM as it is ({connector})"
        return
    role = value.get("kv_role", "kv_both")
    if role != "kv_both":
        out.problems.append(
            f"{full_key}: kv_role={role!r}: this server's LMCache wiring stores and loads (kv_both, as in LMI's "
            "recipe); disaggregated prefill roles are not wired"
        )
        return
    extra = sorted(set(value) - {"kv_connector", "kv_role"})
    unused = f"; {', '.join(extra)} not used (the server builds the connector's settings)" if extra else ""
    env_file = environ.get("LMCACHE_CONFIG_FILE")
    if ours:
        out.translated[full_key] = f"LMCache on through {', '.join(ours)}{unused}"
        if env_file:
            out.not_applicable["LMCACHE_CONFIG_FILE"] = "option.lmcache_config_file / option.lmcache_auto_config wins"
    elif env_file:
        out.props["option.lmcache_config_file"] = env_file
        out.translated[full_key] = f"LMCache on: option.lmcache_config_file={env_file} (LMCACHE_CONFIG_FILE){unused}"
        out.translated["LMCACHE_CONFIG_FILE"] = f"option.lmcache_config_file={env_file}"
    else:
        out.props["option.lmcache_auto_config"] = "true"
        out.translated[full_key] = f"LMCache on: option.lmcache_auto_config=true (no LMCACHE_CONFIG_FILE){unused}"


_SPECIAL = {
    "engine": _engine,
    "task": _task,
    "normalize": _normalize,
    "enable_reasoning": _enable_reasoning,
    "kv_transfer_config": _kv_transfer_config,
}


def apply_lmi_defaults(engine_args: dict[str, Any]) -> dict[str, str]:
    """LMI's defaults where they differ from vLLM's; returns engine argument -> why, for the log.

    LoRA: max_loras 4 (vLLM: 1). The tensor-parallel default is `tensor_parallel`'s (it needs the
    model and the GPUs)."""
    why: dict[str, str] = {}
    if engine_args.get("enable_lora") and "max_loras" not in engine_args:
        engine_args["max_loras"] = LMI_DEFAULT_MAX_LORAS
        why["max_loras"] = f"{LMI_DEFAULT_MAX_LORAS}: LMI's default with option.enable_lora=true (vLLM's is 1)"
    return why
