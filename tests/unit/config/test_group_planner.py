"""The multi-node planner over the big models' config.json (tests/data/model_configs, no weights) and
the two nodes users run them on: how many nodes of 8 x H100 80GB and of 8 x H200 141GB each needs,
the degrees (TP within a node, one PP stage per node; the expert-parallel variant for MoE), and a
option.cluster_size too small for the weights refused naming the size that holds them."""

from __future__ import annotations

import os

import pytest

from lmi_server.config.group_planner import REFERENCE_NODES, nodes_needed, plan_nodes
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.config.tensor_parallel import read_model_config
from lmi_server.config.weights import count_parameters
from tests.unit.config.test_tensor_parallel import MODELS, fake_nvidia_smi

H100, H200 = "8 x H100 80GB", "8 x H200 141GB"
# model -> nodes needed on (8 x H100, 8 x H200); public recipes agree: DeepSeek-V3 and Mistral Large 3
# FP8 on one 8 x H200 node, two 8 x H100 nodes; Kimi-K2 on 16 GPUs even on H200 (its long context's KV).
EXPECTED = {
    "DeepSeek-V3": (2, 1),
    "Mistral-Large-3-675B-Instruct-2512": (2, 1),
    "Kimi-K2-Instruct": (2, 2),
    "Qwen2.5-72B-Instruct": (1, 1),
}


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_nodes_needed_on_h100_and_h200(model):
    plans = {p["node"]: p for p in nodes_needed(str(MODELS / model), {})}
    for node, want in zip((H100, H200), EXPECTED[model]):
        plan = plans[node]
        assert plan["nodes"] == want, (node, plan)
        assert plan["tensor_parallel_degree"] == 8 and plan["pipeline_parallel_degree"] == want
        assert plan["per_gpu_gib"] < plan["usable_gib_per_gpu"]
        assert (plan["properties"].get("option.cluster_size") == str(want)) == (want > 1)


@pytest.mark.parametrize("model", ["DeepSeek-V3", "Mistral-Large-3-675B-Instruct-2512", "Kimi-K2-Instruct"])
def test_moe_models_get_the_expert_parallel_variant(model):
    plan = plan_nodes(read_model_config(str(MODELS / model)), {}, REFERENCE_NODES[H100], H100)
    assert plan.expert_parallel.startswith("option.tensor_parallel_degree=16") and "enable_expert_parallel=true" in plan.expert_parallel
    assert "option.cluster_size=2" in plan.expert_parallel


def test_dense_models_have_no_expert_parallel_variant():
    plan = plan_nodes(read_model_config(str(MODELS / "Qwen2.5-72B-Instruct")), {}, REFERENCE_NODES[H100], H100)
    assert plan.expert_parallel is None


@pytest.mark.parametrize("model,billions", [("Mistral-Large-3-675B-Instruct-2512", 675), ("Kimi-K2-Instruct", 1026),
                                            ("DeepSeek-V3", 671)])
def test_fixtures_reproduce_the_published_parameter_counts(model, billions):
    assert round(count_parameters(read_model_config(str(MODELS / model))).total / 1e9) == billions


def test_a_shorter_max_model_len_lets_kimi_fit_one_h200_node():
    plan = plan_nodes(read_model_config(str(MODELS / "Kimi-K2-Instruct")), {"max_model_len": 16384},
                      REFERENCE_NODES[H200], H200)
    assert plan.nodes == 1


@pytest.fixture
def node_of(tmp_path, monkeypatch):
    def make(card: int) -> None:
        fake_nvidia_smi(tmp_path / f"bin{card}", 8, card)
        monkeypatch.setenv("PATH", f"{tmp_path / f'bin{card}'}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(8))))
    return make


@pytest.mark.parametrize("model,card,too_small,needs", [
    ("DeepSeek-V3", 80, 1, 2), ("Kimi-K2-Instruct", 141, 1, 2), ("Mistral-Large-3-675B-Instruct-2512", 80, 1, 2),
])
def test_a_cluster_too_small_for_the_weights_is_refused_naming_the_size_that_holds_them(model, card, too_small, needs, node_of):
    node_of(card)
    with pytest.raises(ConfigError) as info:
        build_serving_config({"option.cluster_size": str(too_small)}, MODELS / model, environ={})
    (found,) = info.value.problems
    assert f"option.cluster_size={needs}" in found, found
    if card == 141:  # the weights fit one node; one max_model_len sequence's KV does not
        assert found.startswith(f"option.cluster_size={too_small}: ") and "max_model_len" in found


def test_a_model_too_big_for_one_node_names_the_group_that_holds_it(node_of):
    node_of(80)
    with pytest.raises(ConfigError) as info:
        build_serving_config({}, MODELS / "DeepSeek-V3", environ={})
    (found,) = info.value.problems
    assert found.endswith("over 2 nodes like this one: option.cluster_size=2 (tensor_parallel_degree=8 x "
                          "pipeline_parallel_degree=2; docs/multi-node.md)")


@pytest.mark.parametrize("model,card", [("DeepSeek-V3", 80), ("Kimi-K2-Instruct", 141), ("Kimi-K2-Instruct", 80)])
def test_the_planned_group_is_accepted_with_tp_per_node_and_pp_per_node(model, card, node_of):
    node_of(card)
    env = {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "lws-0.lws"}
    cfg = build_serving_config({}, MODELS / model, environ=env)
    assert (cfg.engine_args["tensor_parallel_size"], cfg.engine_args["pipeline_parallel_size"]) == (8, 2)
    assert cfg.group.role == "worker" and cfg.engine_args["node_rank"] == 1
