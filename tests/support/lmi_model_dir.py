"""An LMI user's model directory, unchanged: a model-level model.py (custom handle, input and output
formatters, a helper module beside it) and adapters whose adapter_config.json names the hub model
they were fine-tuned from, one with its own output formatter and one whose formatter raises.
Written for tests/e2e/test_lmi_dropin.py's server (the `lmi_dir` fixture, tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

HUB_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the adapters say; the server serves lmi-demo

MODEL_PY = '''
import json

from djl_python import Input
from djl_python.encode_decode import decode
from djl_python.input_parser import input_formatter
from djl_python.output_formatter import output_formatter

import helpers  # a module beside model.py
from djl_python.async_utils import create_non_stream_output


async def handle(inputs: Input):
    """LMI's custom handler: takes requests that ask for it, leaves the rest to the server."""
    payload = decode(inputs, inputs.get_property("Content-Type"))
    if payload.get("handler") != "custom":
        return None
    if payload.get("fail"):
        raise RuntimeError("custom handler intentionally failed")
    props = inputs.get_properties()
    return create_non_stream_output({"custom_handler_used": True, "echo": payload.get("inputs"), "model_id": props.get("model_id")})


@input_formatter
def custom_input_formatter(decoded_payload, tokenizer=None, **kwargs):
    if "question" not in decoded_payload:
        return decoded_payload  # LMI and OpenAI bodies pass through
    if decoded_payload["question"] == "fail":
        raise ValueError("input formatter refused the question")
    if tokenizer is None or not tokenizer.encode(decoded_payload["question"]):
        raise ValueError("the engine's tokenizer was not handed over")
    return {
        "inputs": decoded_payload["question"],
        "parameters": {"max_new_tokens": decoded_payload.get("max_len", 8), "temperature": 0},
        "stream": decoded_payload.get("stream", False),
    }


@output_formatter
def custom_output_formatter(response):
    if isinstance(response, str):  # a stream chunk, the string vLLM yields: "data: {...}"
        data = response[len("data: "):].strip()
        if data == "[DONE]":
            return {"piece": None, "done": True, "formatted_by": "model"}
        choice = (json.loads(data).get("choices") or [{}])[0]
        piece = choice["text"] if "text" in choice else (choice.get("delta") or {}).get("content")
        return {"piece": piece, "formatted_by": "model"}
    choice = response.choices[0]
    text = choice.message.content if hasattr(choice, "message") else choice.text
    return helpers.wrap(text, response)
'''

HELPERS_PY = '''
def wrap(text, response):
    return {"answer": text, "formatted_by": "model", "type": type(response).__name__}
'''

ADAPTER_MODEL_PY = '''
from djl_python.output_formatter import output_formatter


@output_formatter
def adapter_output(response):
    choice = response.choices[0]
    return {"adapter_answer": choice.text, "formatted_by": "adapter", "type": type(response).__name__}
'''

RAISING_MODEL_PY = '''
from djl_python.output_formatter import output_formatter


@output_formatter
def broken(response):
    raise RuntimeError("output formatter intentionally failed")
'''


def write_lmi_model_dir(model_dir: Path, adapters_for: Callable[[Path, Path], None], base: Path) -> Path:
    """model.py, helpers.py and adapters/ (LMI's layout, beside serving.properties); the adapters' root."""
    (model_dir / "model.py").write_text(MODEL_PY)
    (model_dir / "helpers.py").write_text(HELPERS_PY)
    root = model_dir / "adapters"
    root.mkdir()
    adapters_for(base, root)
    shutil.rmtree(root / "shouter")
    shutil.copytree(root / "hello-printer", root / "formatted")
    (root / "formatted" / "model.py").write_text(ADAPTER_MODEL_PY)
    shutil.copytree(root / "hello-printer", root / "raising")
    (root / "raising" / "model.py").write_text(RAISING_MODEL_PY)
    for name in ("hello-printer", "formatted", "raising"):
        cfg_path = root / name / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["base_model_name_or_path"] = HUB_BASE  # fine-tuned from the hub id
        cfg_path.write_text(json.dumps(cfg))
    return root
