"""The configuration reference, generated from the one definition of each key."""

from __future__ import annotations

from lmi_server.config.options import SECTIONS
from lmi_server.config.schema import LMI_ALIASES, NOT_APPLICABLE, vllm_frontend_arg_table, vllm_frontend_excluded


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
    lines.append("Accepted for compatibility with LMI files, reported as not applicable:")
    lines.append("")
    for key, why in NOT_APPLICABLE.items():
        lines.append(f"- `option.{key}`: {why}")
    return "\n".join(lines)
