"""The one validated ServingConfig, built from merged `option.*` properties.

Every key has one definition: our own keys are fields of the pydantic sections below (name =
option key, with type, default and description); vLLM's engine arguments come from the table
generated from the pinned vLLM (`vllm_engine_args.json`), so this module never imports vLLM.
LMI's names are mapped onto vLLM's; LMI keys that mean nothing here are accepted and reported.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmi_server import catalogue
from lmi_server.config import host
from lmi_server.config.engine_values import (
    coerce_engine_value,
    example_value,
    vllm_engine_arg_table,
    vllm_frontend_arg_table,
    vllm_frontend_excluded,
)
from lmi_server.config.group import GroupPlan, apply_group, check_degrees, check_keys, plan_group
from lmi_server.config.group_planner import check_cluster_holds_weights, group_hint
from lmi_server.config.model_kind import ModelKind, decide_kind
from lmi_server.config.lmi_compat import (
    EnvironmentReading,
    apply_lmi_defaults,
    keys_of,
    lmi_aliases,
    not_applicable_options,
    translate_properties,
)
from lmi_server.config.options import (
    SECTIONS,
    AdapterOptions,
    LMCacheOptions,
    SecurityOptions,
    ServerOptions,
    SessionOptions,
    SpeculativeOptions,
    TenantOptions,
)
from lmi_server.config.tensor_parallel import plan_tensor_parallel
from lmi_server.redact import mask_value

DEFAULT_MODEL_DIR = Path("/opt/ml/model")
# The built-in models' names, as tests and callers know them; their facts are in the catalogue.
DEMO_SERVED_NAME = catalogue.DEMO.name
ASSISTANT_SERVED_NAME = catalogue.ASSISTANT.name
EMBEDDING_SERVED_NAME = catalogue.EMBEDDING.name
VISION_SERVED_NAME = catalogue.VISION.name


# LMI name -> vLLM engine-argument name, and LMI keys accepted as not applicable: both from the
# list of LMI's keys (`lmi_keys.json`), which `lmi_compat` applies before validation.
LMI_ALIASES: dict[str, str] = lmi_aliases()
LMI_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
NOT_APPLICABLE: dict[str, str] = not_applicable_options()

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


# A value as problems quote it: `option.key='...'` (repr, so either quote); apostrophes in prose
# ("the engine worker's ... model's") are not values.
_LONG_QUOTED = re.compile(r"""(?<==)(['"])((?:(?!\1).){120})(?:(?!\1).){40,}\1""")


def _clip_values(problem: str) -> str:
    """Quote at most the start of a very long value: an error must name the key, not echo a megabyte."""
    return _LONG_QUOTED.sub(
        lambda m: f"{m.group(1)}{m.group(2)}...{m.group(1)} ({len(m.group(0)) - 2:,} characters)", problem
    )


class ConfigError(ValueError):
    """An invalid configuration; `problems` lists one message per key."""

    def __init__(self, problems: list[str]):
        problems = [_clip_values(p) for p in problems]
        self.problems = problems
        super().__init__("invalid configuration:\n  - " + "\n  - ".join(problems))


# Engine arguments this server owns: setting them in properties would break the wiring.
RESERVED_ENGINE_ARGS = {"kv_transfer_config", "model"}


def own_keys() -> dict[str, tuple[str, Any]]:
    """option key -> (section, pydantic FieldInfo) for every key that is ours."""
    keys: dict[str, tuple[str, Any]] = {}
    for section, model in SECTIONS.items():
        for name, info in model.model_fields.items():
            keys[name] = (section, info)
    return keys


def all_known_keys() -> list[str]:
    keys = set(own_keys()) | set(keys_of("option")) | {"dtype"}
    keys |= set(vllm_engine_arg_table()) - RESERVED_ENGINE_ARGS
    keys |= set(vllm_frontend_arg_table())
    return sorted(keys)


def suggest(key: str) -> str:
    match = difflib.get_close_matches(key, all_known_keys(), n=1, cutoff=0.6)
    return f" (did you mean option.{match[0]}?)" if match else ""


class ResolvedModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: Literal["local", "hub", "demo", "assistant", "embedding", "vision", "s3"]
    path_or_id: str
    served_names: list[str]


class ServingConfig(BaseModel):
    """Everything the server needs, resolved and validated. Built by `build_serving_config`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    model_dir: Path
    model: ResolvedModel
    kind: ModelKind
    """What the model does (generate, embed, classify) and why: the HTTP routes follow it."""
    engine_args: dict[str, Any]
    frontend_args: dict[str, Any] = Field(default_factory=dict)
    """vLLM `serve` front-end options (applied to vLLM's serving objects, not to the engine)."""
    server: ServerOptions
    lmcache: LMCacheOptions
    speculative: SpeculativeOptions
    adapters: AdapterOptions
    sessions: SessionOptions
    security: SecurityOptions = Field(default_factory=SecurityOptions)
    tenants: TenantOptions = Field(default_factory=TenantOptions)
    group: GroupPlan | None = None
    """This node's part in a multi-node group (option.cluster_size / LeaderWorkerSet); None: one node."""
    not_applicable: dict[str, str] = Field(default_factory=dict)
    translated: dict[str, str] = Field(default_factory=dict)
    """LMI keys and environment variables turned into this server's settings: name -> what it became."""
    defaults: dict[str, str] = Field(default_factory=dict)
    """LMI's defaults applied where they differ from vLLM's: engine argument -> value and why."""
    overridden_by_file: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)


def _resolve_model(model_dir: Path, server: ServerOptions, problems: list[str]) -> ResolvedModel:
    def names(default: str) -> list[str]:
        if server.served_model_name:
            return [n.strip() for n in server.served_model_name.split(",") if n.strip()]
        return [default]

    model_id = server.model_id
    if model_id is None:
        if (model_dir / "config.json").is_file():
            return ResolvedModel(source="local", path_or_id=str(model_dir), served_names=names(model_dir.name))
        model_id = catalogue.DEFAULT_MODEL.name
    builtin = catalogue.by_name(model_id)
    if builtin is not None:  # its directory is built or converted at start-up (runtime)
        try:
            path = str(builtin.directory())
        except RuntimeError as exc:  # the package that ships it is missing: say what to install
            problems.append(str(exc))
            path = model_id
        return ResolvedModel(source=builtin.source, path_or_id=path, served_names=names(model_id))
    if "://" in model_id:
        from lmi_server.source_ref import ModelSourceError, parse_s3

        try:  # downloaded at start-up (runtime), never while validating
            return ResolvedModel(source="s3", path_or_id=model_id, served_names=names(parse_s3(model_id).name))
        except ModelSourceError as exc:
            problems.append(
                f"option.model_id={model_id!r}: {exc.cause}; give s3://bucket/prefix, s3://bucket/key.zip, "
                "a directory or a hub id"
            )
            return ResolvedModel(source="hub", path_or_id=model_id, served_names=names(model_id))
    candidate = Path(model_id).expanduser()
    for path in ([candidate] if candidate.is_absolute() else [model_dir / candidate, candidate]):
        if path.is_dir():
            if not (path / "config.json").is_file():
                problems.append(f"option.model_id={model_id!r}: directory {path} has no config.json")
            return ResolvedModel(source="local", path_or_id=str(path.resolve()), served_names=names(path.resolve().name))
    if candidate.is_absolute() or model_id.startswith(".") or not _HUB_ID.match(model_id):
        problems.append(
            f"option.model_id={model_id!r}: no such directory (looked in {model_dir}) and not a "
            "hub id of the form org/name"
        )
    return ResolvedModel(source="hub", path_or_id=model_id, served_names=names(model_id))


def _from_instance_gpu_count(raw: str, environment: EnvironmentReading, sources: dict[str, str] | None) -> bool:
    """Whether the degree is SageMaker's SM_NUM_GPUS (the instance's GPU count, set for every
    endpoint) rather than a degree someone chose: it is then a bound, as `max` is."""
    said = environment.translated.get("SM_NUM_GPUS")
    return said == f"option.tensor_parallel_degree={raw}" and (sources or {}).get("option.tensor_parallel_degree") == "env"


@dataclass
class _SortedKeys:
    """The merged properties sorted by who reads them, still as written (strings)."""

    sections: dict[str, dict[str, str]] = field(default_factory=lambda: {name: {} for name in SECTIONS})
    engine: dict[str, tuple[str, str]] = field(default_factory=dict)  # vllm name -> (key as written, raw)
    frontend: dict[str, str] = field(default_factory=dict)


def _engine_key(keys: _SortedKeys, key: str, raw: str, problems: list[str]) -> None:
    """An LMI alias or a vLLM engine argument; two names of one setting must agree."""
    engine_raw = keys.engine
    if key in LMI_ALIASES:
        target = LMI_ALIASES[key]
        if target in engine_raw and engine_raw[target][1].strip() != raw.strip():
            problems.append(
                f"option.{key}={raw!r} conflicts with option.{target}={engine_raw[target][1]!r}: "
                "they name the same setting; keep one"
            )
        engine_raw[target] = (key, raw)
        return
    alias = next((a for a, t in LMI_ALIASES.items() if t == key), None)
    if key in engine_raw and engine_raw[key][1].strip() != raw.strip():
        problems.append(
            f"option.{key}={raw!r} conflicts with option.{alias}={engine_raw[key][1]!r}: "
            "they name the same setting; keep one"
        )
        return
    engine_raw[key] = (key, raw)


def _sort_keys(properties: dict[str, str], problems: list[str]) -> _SortedKeys:
    """Each key to its section, vLLM's engine or its front end; an unknown key is a problem naming the
    nearest known one."""
    keys = _SortedKeys()
    mine = own_keys()
    table, frontend_table = vllm_engine_arg_table(), vllm_frontend_arg_table()
    for full_key, raw in properties.items():
        if not full_key.startswith("option."):
            problems.append(f"{full_key}={raw!r}: unknown key; settings are option.<name>{suggest(full_key.lower())}")
            continue
        key = full_key[len("option.") :].lower()
        if key in mine:
            keys.sections[mine[key][0]][key] = raw
        elif key in LMI_ALIASES:
            _engine_key(keys, key, raw, problems)
        elif key in RESERVED_ENGINE_ARGS:
            problems.append(
                f"option.{key}: set by the server itself; use option.model_id / option.lmcache_* instead"
            )
        elif key in table:
            _engine_key(keys, key, raw, problems)
        elif key in frontend_table:
            keys.frontend[key] = raw
        elif key in vllm_frontend_excluded():
            problems.append(f"option.{key}: not a key of this container; {vllm_frontend_excluded()[key]}")
        else:
            hint = suggest(key)  # a mistyped secret key (api_kye) is masked like the real one
            problems.append(f"option.{key}={mask_value(key + hint, raw)!r}: unknown key{hint}")
    return keys


def _validate_sections(section_values: dict[str, dict[str, str]], problems: list[str]) -> dict[str, BaseModel]:
    sections: dict[str, BaseModel] = {}
    for name, model in SECTIONS.items():
        try:
            sections[name] = model.model_validate(section_values[name])
        except ValidationError as exc:
            for err in exc.errors():
                field_name = ".".join(str(p) for p in err["loc"])
                value = section_values[name].get(str(err["loc"][0]), err.get("input"))
                value = mask_value(field_name, value)
                problems.append(f"option.{field_name}={value!r}: {err['msg']}")
            sections[name] = model()
    return sections


def _coerce_engine_args(
    engine_raw: dict[str, tuple[str, str]], environment: EnvironmentReading, sources: dict[str, str] | None,
    problems: list[str],
) -> tuple[dict[str, Any], str | None]:
    """The engine arguments typed as vLLM wants them, and a tensor-parallel degree that is a bound
    ("max" or SageMaker's GPU count), resolved later with the model."""
    table = vllm_engine_arg_table()
    engine_args: dict[str, Any] = {}
    tp_requested: str | None = None
    for target, (written, raw) in engine_raw.items():
        try:
            if written == "tensor_parallel_degree" and raw.strip().lower() == "max":
                tp_requested = "max"
                continue
            if target == "dtype":
                raw = LMI_DTYPES.get(raw.strip().lower(), raw)
            desc = table[target]
            if target == "reasoning_parser" and "reasoning_parser_plugin" in engine_raw:
                desc = {k: v for k, v in desc.items() if k != "known"}  # the plugin may register it
            engine_args[target] = coerce_engine_value(target, raw, desc)
            if written == "tensor_parallel_degree" and _from_instance_gpu_count(raw, environment, sources):
                tp_requested = f"instance:{engine_args.pop(target)}"
        except ValueError as exc:
            problems.append(f"option.{written}={raw!r}: {exc} (example: {example_value(written, table[target])})")
    return engine_args, tp_requested


def _coerce_frontend_args(frontend_raw: dict[str, str], problems: list[str]) -> dict[str, Any]:
    frontend_table = vllm_frontend_arg_table()
    frontend_args: dict[str, Any] = {}
    for key, raw in frontend_raw.items():
        desc = frontend_table[key]
        if key == "tool_call_parser" and "tool_parser_plugin" in frontend_raw:
            desc = {k: v for k, v in desc.items() if k != "known"}  # the plugin may register it
        try:
            frontend_args[key] = coerce_engine_value(key, raw, desc)
        except ValueError as exc:
            problems.append(f"option.{key}={raw!r}: {exc} (example: {example_value(key, frontend_table[key])})")
    return frontend_args


def _model_engine_args(
    engine_args: dict[str, Any], model: ResolvedModel, tp_requested: str | None, group: GroupPlan | None = None,
    cluster_size: int | None = None,
) -> tuple[dict[str, str], ModelKind]:
    """Tensor parallelism, LMI's defaults and the model's kind, which depend on the resolved model
    (a built-in model's from its catalogue entry); returns (defaults applied, kind). In a group the
    degrees span every node (each node assumed to have this node's GPUs)."""
    builtin = catalogue.by_source(model.source)
    node, path = host.gpu_inventory(), None if model.source in ("hub", "s3") else model.path_or_id
    nodes = group.size if group is not None else cluster_size
    if nodes is not None and (too_small := check_cluster_holds_weights(nodes, path, engine_args, node)):
        raise ConfigError([too_small])
    tp = plan_tensor_parallel(
        engine_args, requested=tp_requested, inventory=group.inventory(node) if group is not None else node,
        model_path=path, builtin=builtin is not None,
    )
    if tp.problems:
        raise ConfigError([p + group_hint(path, engine_args, node) for p in tp.problems])
    if tp.degree is not None:
        engine_args["tensor_parallel_size"] = tp.degree
    if group is not None and (group_problems := check_degrees(group, engine_args, node.count)):
        raise ConfigError(group_problems)
    defaults = {"tensor_parallel_size": tp.why} if tp.why else {}
    defaults.update(apply_lmi_defaults(engine_args))
    reads_files = model.source == "local" or (builtin is not None and builtin.reads_own_files)
    kind = decide_kind(engine_args, model.path_or_id if reads_files else None, builtin=builtin and builtin.kind)
    engine_args["model"] = model.path_or_id
    engine_args["served_model_name"] = model.served_names
    return defaults, kind


def build_serving_config(
    properties: dict[str, str],
    model_dir: Path = DEFAULT_MODEL_DIR,
    *,
    sources: dict[str, str] | None = None,
    overridden_by_file: list[str] | None = None,
    environ: dict[str, str] | None = None,
    environment: EnvironmentReading | None = None,
) -> ServingConfig:
    """Validate merged properties; raise ConfigError listing every problem at once.

    LMI's own keys are first turned into this server's (`lmi_compat`); `environment` carries what
    the environment said beside its properties (not-applicable variables, problems)."""
    environment = environment or EnvironmentReading()
    lmi = translate_properties(properties, environ)
    problems: list[str] = [*environment.problems, *lmi.problems]
    keys = _sort_keys(lmi.props, problems)
    sections = _validate_sections(keys.sections, problems)
    engine_args, tp_requested = _coerce_engine_args(keys.engine, environment, sources, problems)
    frontend_args = _coerce_frontend_args(keys.frontend, problems)
    server = sections["server"]
    assert isinstance(server, ServerOptions)
    model = _resolve_model(model_dir, server, problems)
    group, group_problems = plan_group(server.cluster_size, environ or {}, master_port=engine_args.get("master_port"))
    problems += group_problems + (check_keys(group, engine_args, sections['lmcache']) if group else [])
    if problems:
        raise ConfigError(problems)
    engine_args.update(lmi.engine_args)
    group_defaults: dict[str, str] = {}
    if group is not None:
        server, group_defaults = apply_group(group, engine_args, server)
        sections["server"] = server
    defaults, kind = _model_engine_args(engine_args, model, tp_requested, group, server.cluster_size)
    defaults.update(group_defaults)
    return ServingConfig(
        group=group,
        model_dir=model_dir,
        model=model,
        kind=kind,
        engine_args=engine_args,
        frontend_args=frontend_args,
        not_applicable={**environment.not_applicable, **lmi.not_applicable},
        translated={**environment.translated, **lmi.translated},
        defaults=defaults,
        overridden_by_file=list(overridden_by_file or []),
        sources=dict(sources or {}),
        **sections,
    )
