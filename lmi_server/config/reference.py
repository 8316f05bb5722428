"""The configuration reference, generated from the one definition of each key."""

from __future__ import annotations

from lmi_server.config.lmi_compat import LmiKey, lmi_keys
from lmi_server.config.options import SECTIONS
from lmi_server.config.schema import LMI_ALIASES, vllm_frontend_arg_table, vllm_frontend_excluded


def _type_name(annotation) -> str:
    text = str(annotation).replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
    text = text.replace("<class '", "").replace("'>", "")
    if text.startswith("Optional["):
        text = text[len("Optional[") : -1] + " or None"
    return text.replace(" | ", " or ").replace("|", " or ")


def options_markdown() -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for section, model in SECTIONS.items():
        for name, info in model.model_fields.items():
            default = "none" if info.default is None else f"`{info.default}`"
            lines.append(f"| `option.{name}` | {_type_name(info.annotation)} | {default} | {info.description or ''} |")
    lines.append("")
    lines.append("LMI names mapped onto vLLM engine arguments:")
    lines.append("")
    lines.append("| LMI key | vLLM engine argument |")
    lines.append("|---|---|")
    for lmi, vllm in LMI_ALIASES.items():
        lines.append(f"| `option.{lmi}` | `{vllm}` |")
    lines.append("")
    lines.append(
        "vLLM `serve` front-end options, validated like the engine arguments (generated from the pinned vLLM): "
        + ", ".join(f"`option.{k}`" for k in vllm_frontend_arg_table())
        + ". `option.chat_template` is a file (relative to the model directory) or the template inline."
    )
    lines.append("")
    lines.append("vLLM `serve` options that are not keys here (setting one is an error that says why):")
    lines.append("")
    by_reason: dict[str, list[str]] = {}
    for key, why in vllm_frontend_excluded().items():
        by_reason.setdefault(why, []).append(f"`{key}`")
    for why, keys in by_reason.items():
        lines.append(f"- {', '.join(keys)}: {why}")
    lines.append("")
    lines.append(
        "LMI's own keys and environment variables (mapped, not applicable, or refused, each with its reason): "
        "see *Coming from LMI*."
    )
    return "\n".join(lines)


LMI_TABLE_BEGIN = "<!-- lmi-keys:begin (generated: python -m lmi_server.config.reference; a test compares) -->"
LMI_TABLE_END = "<!-- lmi-keys:end -->"
_KIND = {"env": "environment", "top-level": "top-level key", "option": "option"}


def _here(entry: LmiKey) -> str:
    if entry.here == "mapped":
        to = entry.to or ""
        text = f"mapped: {to}" if " " in to else f"mapped to `{to}`"
        if entry.transform == "negate":
            text += " (negated)"
        elif entry.transform == "mib_to_bytes":
            text += " (MiB to bytes)"
        if entry.note:
            text += f"; {entry.note}"
    elif entry.here == "environment":
        text = f"read from the environment: {entry.why}"
    elif entry.here == "refused":
        return f"refused: {entry.why}"
    else:
        text = f"not applicable: {entry.why}"
    if entry.accepted_values:
        text += f"; values other than {', '.join(f'`{v}`' for v in entry.accepted_values)} are refused: {entry.refused_why}"
    if entry.refused_values:
        text += f"; {', '.join(f'`{v}`' for v in entry.refused_values)} is refused: {entry.refused_why}"
    return text


def lmi_keys_markdown() -> str:
    """The docs' table of LMI's keys and environment variables, from `lmi_keys.json`."""
    lines = [LMI_TABLE_BEGIN, "", "| LMI name | kind | what LMI means | here |", "|---|---|---|---|"]
    for entry in lmi_keys():
        cells = [f"`{entry.name}`", _KIND[entry.kind], entry.meaning, _here(entry)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", LMI_TABLE_END]
    return "\n".join(lines)


if __name__ == "__main__":
    print(lmi_keys_markdown())
