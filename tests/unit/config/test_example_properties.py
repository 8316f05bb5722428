"""serving.properties.example mentions every key and its active lines are a valid configuration."""

import re
from pathlib import Path

from lmi_server.config.properties import parse_properties
from lmi_server.config.schema import build_serving_config, own_keys

EXAMPLE = Path(__file__).parents[3] / "serving.properties.example"


def test_every_own_key_is_in_the_example():
    text = EXAMPLE.read_text()
    missing = [k for k in own_keys() if f"option.{k}=" not in text]
    assert not missing


def test_active_lines_validate(tmp_path):
    props = parse_properties(EXAMPLE.read_text())
    cfg = build_serving_config(props, tmp_path)
    assert cfg.engine_args["max_num_seqs"] == 64 and cfg.engine_args["dtype"] == "bfloat16"


def test_commented_lines_validate_too(tmp_path):
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^# (option\.\w+=\S.*?)(\s+#.*)?$", line)
        if m:
            lines.append(m.group(1))
    props = parse_properties("\n".join(lines))
    props.pop("option.lmcache_auto_config")  # the two LMCache switches exclude each other
    props.pop("option.sessions_path")  # sessions live in one place: this replica's disk or a shared Redis
    props["option.model_id"] = str(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    cfg = build_serving_config(props, tmp_path)
    assert cfg.engine_args["max_num_batched_tokens"] == 8192
