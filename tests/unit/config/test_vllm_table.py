"""The engine-argument table must describe the installed (pinned) vLLM exactly."""

import json
from pathlib import Path

from lmi_server.config.vllm_table_gen import describe_engine_args


def test_table_matches_installed_vllm():
    committed = json.loads((Path(__file__).parents[3] / "lmi_server/config/vllm_engine_args.json").read_text())
    current = describe_engine_args()
    assert committed == current, "run scripts/gen_vllm_engine_args.py after changing the vLLM pin"


def test_table_covers_the_settings_users_need():
    args = json.loads((Path(__file__).parents[3] / "lmi_server/config/vllm_engine_args.json").read_text())["args"]
    for name in ("max_model_len", "max_num_seqs", "dtype", "enable_prefix_caching", "speculative_config", "enable_lora", "max_loras"):
        assert name in args
