"""The configuration reference, generated from the one definition of each key."""

from __future__ import annotations

from lmi_server.config.schema import LMI_ALIASES, NOT_APPLICABLE, SECTIONS


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
    lines.append("Accepted for compatibility with LMI files, reported as not applicable:")
    lines.append("")
    for key, why in NOT_APPLICABLE.items():
        lines.append(f"- `option.{key}`: {why}")
    return "\n".join(lines)
