"""s3:// wherever a model is named: option.model_id (downloaded at start-up, only described by
`lmi-server config`), the speculative draft, and an adapter's src; failures are start-up errors or
an adapter registration's 424, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmi_server import model_source as ms
from lmi_server.config.schema import ConfigError, build_serving_config
from tests.support.s3 import moto_s3, s3_client, s3_env, upload_dir  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32",
    "vocab_size": 128, "intermediate_size": 128,
}
DRAFT = {**TINY, "num_hidden_layers": 1, "architectures": ["EagleLlamaForCausalLM"]}


def upload_config(endpoint: str, tmp_path: Path, prefix: str, config: dict) -> str:
    src = tmp_path / "src" / prefix
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(config))
    upload_dir(endpoint, "models", prefix, src)
    return f"s3://models/{prefix}"


def no_s3(monkeypatch):
    monkeypatch.setattr(ms.s3, "client", lambda url: pytest.fail("S3 contacted"))


def test_config_says_where_the_model_will_go_and_downloads_nothing(s3_env, tmp_path, monkeypatch):
    from lmi_server.runtime import resolve_runtime

    no_s3(monkeypatch)
    cfg = build_serving_config({"option.model_id": "s3://models/tiny", "option.max_model_len": "1024"}, tmp_path / "md")
    runtime = resolve_runtime(cfg, build_demo=False)
    assert runtime.engine_args["model"] == "s3://models/tiny"
    assert f"option.model_id=s3://models/tiny: will be downloaded to {ms.local_dir('s3://models/tiny')} at start-up" in runtime.notes
    assert not (tmp_path / "cache").exists()


def test_serving_downloads_the_model_before_the_engine_is_built(s3_env, tmp_path):
    from lmi_server.runtime import resolve_runtime

    url = upload_config(s3_env, tmp_path, "tiny", TINY)
    cfg = build_serving_config({"option.model_id": url, "option.max_model_len": "1024"}, tmp_path / "md")
    assert cfg.model.served_names == ["tiny"]
    runtime = resolve_runtime(cfg, build_demo=True)
    assert runtime.engine_args["model"] == str(ms.local_dir(url))
    assert json.loads(Path(runtime.engine_args["model"], "config.json").read_text()) == TINY
    # Later, `lmi-server config` reads the local copy (the KV plan sees the model's config).
    again = resolve_runtime(cfg, build_demo=False)
    assert again.engine_args["model"] == runtime.engine_args["model"]
    assert any("downloaded already" in n for n in again.notes)


def test_a_failed_download_is_a_start_up_error_naming_url_and_cause(s3_env, tmp_path, capsys):
    from lmi_server.cli import main

    md = tmp_path / "md"
    md.mkdir()
    (md / "serving.properties").write_text("option.model_id=s3://no-such-bucket/llama\n")
    assert main(["serve", "--model-dir", str(md)]) == 2
    err = capsys.readouterr().err
    assert "option.model_id='s3://no-such-bucket/llama': cannot be downloaded: bucket 'no-such-bucket' does not exist" in err
    assert "Traceback" not in err
    assert main(["config", "--model-dir", str(md)]) == 0  # describing never downloads
    assert "will be downloaded to" in capsys.readouterr().out


def test_a_draft_model_from_s3(s3_env, tmp_path, monkeypatch):
    from lmi_server.runtime import resolve_speculative

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(TINY))
    url = upload_config(s3_env, tmp_path, "drafts/eagle", DRAFT)
    cfg = build_serving_config(
        {"option.speculative_config": json.dumps({"method": "eagle", "model": url, "num_speculative_tokens": 2})}, target
    )
    notes: list[str] = []
    described = resolve_speculative(cfg, {"model": str(target)}, build_demo=False, notes=notes)
    assert described["model"] == url and "will be downloaded to" in notes[0]
    served = resolve_speculative(cfg, {"model": str(target)}, build_demo=True)
    assert served["model"] == str(ms.local_dir(url))
    # A draft that does not fit the target is refused after download, as a local one is.
    bad = upload_config(s3_env, tmp_path, "drafts/wide", {**DRAFT, "hidden_size": 128})
    cfg = build_serving_config(
        {"option.speculative_method": "eagle", "option.speculative_draft_model": bad}, target
    )
    with pytest.raises(ConfigError, match="hidden_size 128 does not fit"):
        resolve_speculative(cfg, {"model": str(target)}, build_demo=True)
    missing = build_serving_config(
        {"option.speculative_method": "eagle", "option.speculative_draft_model": "s3://models/drafts/none"}, target
    )
    with pytest.raises(ConfigError, match=r"speculative draft model='s3://models/drafts/none': cannot be downloaded: no objects"):
        resolve_speculative(missing, {"model": str(target)}, build_demo=True)
