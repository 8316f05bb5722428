"""The configuration reference page of the documentation site, generated from the config model.

Every `option.*` key comes from its one definition: this server's keys from the pydantic sections
(`options.py`: type, default, description), vLLM's engine and front-end arguments from the table
generated from the pinned vLLM (`vllm_engine_args.json`), LMI's names from `lmi_keys.json`. The
site's build (`docs/hooks/reference.py`) renders it; nothing of it is written by hand.
"""

from __future__ import annotations

from typing import Any

from lmi_server.config.engine_values import vllm_engine_arg_table, vllm_frontend_arg_table, vllm_frontend_excluded
from lmi_server.config.lmi_compat import LMI_DEFAULT_MAX_LORAS, LmiKey, keys_of, lmi_keys
from lmi_server.config.options import SECTIONS
from lmi_server.config.reference import _type_name, lmi_keys_markdown

PAGE_PATH = "reference.md"
_RESERVED = {
    "kv_transfer_config": "set by the server itself from the `option.lmcache_*` keys, except for connectors other "
    "than LMCache's",
}
_DEFAULTS = {"max_loras": f"vLLM's; `{LMI_DEFAULT_MAX_LORAS}` with `option.enable_lora=true` (LMI's)"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _target(entry: LmiKey) -> str | None:
    """The option key (without `option.`) an LMI name lands on, following aliases and top-level keys."""
    if entry.alias:
        return entry.alias
    if entry.kind == "option" and entry.here == "mapped" and not (entry.to or "").startswith("option."):
        return entry.name[len("option."):]
    to = entry.to or ""
    if entry.here != "mapped":
        return None
    if to.startswith("option."):
        key = to[len("option."):]
        alias = keys_of("option").get(key)
        return alias.alias if alias is not None and alias.alias else key
    top = keys_of("top-level").get(to)
    return _target(top) if top is not None else None


def lmi_names() -> dict[str, list[str]]:
    """option key -> LMI's names (option keys, environment variables, top-level keys) that set it."""
    names: dict[str, list[str]] = {}
    for entry in lmi_keys():
        target = _target(entry)
        if target is not None:
            names.setdefault(target, []).append(entry.name)
    return names


def _names_cell(key: str, names: dict[str, list[str]]) -> str:
    return ", ".join(f"`{n}`" for n in names.get(key, [])) or "-"


def _own_tables(names: dict[str, list[str]]) -> list[str]:
    lines: list[str] = []
    for section, model in SECTIONS.items():
        lines += [f"### {section}", "", (model.__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| key | type | default | LMI name | description |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            default = "none" if info.default is None else f"`{info.default}`"
            cells = [f"`option.{name}`", _type_name(info.annotation), default, _names_cell(name, names),
                     info.description or ""]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return lines


def _vllm_type(desc: dict[str, Any]) -> str:
    kind = "choice" if desc["kind"] == "choice" else desc["kind"]
    return kind + (" or None" if desc.get("nullable") else "")


def _vllm_description(key: str, desc: dict[str, Any], meaning: dict[str, str], where: str) -> str:
    parts = [meaning[key]] if key in meaning else [f"vLLM's {where} `{key}`"]
    if desc["kind"] == "choice":
        parts.append("one of " + ", ".join(f"`{c}`" for c in desc["choices"]))
    if desc.get("known"):
        parts.append("known names: " + ", ".join(f"`{k}`" for k in desc["known"]))
    if key in _RESERVED:
        parts.append(_RESERVED[key])
    return "; ".join(parts)


def _vllm_table(table: dict[str, dict[str, Any]], names: dict[str, list[str]], where: str) -> list[str]:
    meaning: dict[str, str] = {}
    for entry in lmi_keys():  # LMI's words for the setting, its own name's first
        if entry.kind == "option":
            name = entry.name[len("option."):]
            meaning.setdefault(name, entry.meaning)
            meaning.setdefault(_target(entry) or name, entry.meaning)
    lines = ["| key | type | default | LMI name | description |", "|---|---|---|---|---|"]
    for key in sorted(table):
        desc = table[key]
        cells = [f"`option.{key}`", _vllm_type(desc), _DEFAULTS.get(key, "vLLM's"), _names_cell(key, names),
                 _vllm_description(key, desc, meaning, where)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines + [""]


def _excluded() -> list[str]:
    by_reason: dict[str, list[str]] = {}
    for key, why in vllm_frontend_excluded().items():
        by_reason.setdefault(why, []).append(f"`{key}`")
    return [f"- {', '.join(sorted(keys))}: {why}" for why, keys in by_reason.items()] + [""]


def reference_page() -> str:
    """The whole page, as Markdown."""
    names = lmi_names()
    engine = {k: v for k, v in vllm_engine_arg_table().items() if k != "model"}
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated at build time by lmi_server/config/reference_page.py from the config model: do not edit. -->",
        "",
        "Every `option.*` key, generated from its one definition. A key is set in `serving.properties`",
        "(`option.max_model_len=8192`) or as an environment variable (`OPTION_MAX_MODEL_LEN=8192`); the file",
        "wins. How values are read, checked and combined: [Configuration](configuration.md). What the server",
        "resolved on a host, with its own defaults for CPU hosts and built-in models: `lmi-server config`.",
        "The *LMI name* column lists the names of LMI (keys and environment variables) that set the same",
        "thing; what every LMI name does here is in the [last table](#lmis-keys-and-environment-variables).",
        "",
        "## This server's keys",
        "",
        *_own_tables(names),
        "## vLLM engine arguments",
        "",
        "Every field of the pinned vLLM's `AsyncEngineArgs` is a key, type-checked before anything starts",
        "(`model` excepted: `option.model_id` names the model).",
        "",
        *_vllm_table(engine, names, "engine argument"),
        "## vLLM front-end options",
        "",
        "What `vllm serve` takes beside the engine arguments, validated the same way.",
        "",
        *_vllm_table(vllm_frontend_arg_table(), names, "front-end option"),
        "## vLLM front-end options that are not keys here",
        "",
        "Setting one is a start-up error that says why:",
        "",
        *_excluded(),
        "## LMI's keys and environment variables",
        "",
        "Mapped, read from the environment, not applicable, or refused, each with its reason",
        "(see [Coming from LMI](lmi-migration.md)).",
        "",
        lmi_keys_markdown(),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_page())
