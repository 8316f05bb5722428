"""The dry run refuses what the engine's own config check would refuse at start-up."""

from __future__ import annotations

import pytest

from lmi_server.preflight import check_chunk_size, check_max_model_len, model_context_length

SMOLLM2 = {"model_type": "llama", "max_position_embeddings": 8192, "rope_theta": 100000}


def test_a_max_model_len_beyond_the_models_context_is_refused(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    problem = check_max_model_len({"max_model_len": 16384}, SMOLLM2)
    assert problem and "option.max_model_len=16384" in problem and "max_position_embeddings=8,192" in problem
    assert check_max_model_len({"max_model_len": 8192}, SMOLLM2) is None
    assert check_max_model_len({}, SMOLLM2) is None
    assert check_max_model_len({"max_model_len": 16384}, None) is None  # hub model: vLLM decides


def test_vllms_override_lets_it_through(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert check_max_model_len({"max_model_len": 16384}, SMOLLM2) is None


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 16384),
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 32768),
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072),
        ({"n_positions": 1024, "max_position_embeddings": 2048}, 1024),  # the smallest key wins
        ({"text_config": {"max_position_embeddings": 8192}}, 8192),
        ({"hidden_size": 8}, None),
    ],
)
def test_context_length_is_derived_as_the_engine_does(config, expected):
    found = model_context_length(config)
    assert (found[0] if found else None) == expected


def test_an_lmcache_chunk_must_be_whole_kv_blocks():
    problem = check_chunk_size(200, {}, gpu=False)
    assert problem and "block size 128" in problem and "chunk_size: 256" in problem
    assert check_chunk_size(256, {}, gpu=False) is None
    assert check_chunk_size(128, {}, gpu=False) is None
    assert check_chunk_size(200, {}, gpu=True) and check_chunk_size(208, {}, gpu=True) is None  # 16 on GPUs
    assert "option.block_size" in check_chunk_size(256, {"block_size": 96}, gpu=False)
    assert check_chunk_size(None, {}, gpu=False) is None
