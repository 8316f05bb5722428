"""Multi-node groups from option.cluster_size and the LeaderWorkerSet environment: the plan each node
gets (leader or headless worker, vLLM's nnodes/node_rank/master_addr), degrees that span the group,
and the groups vLLM would refuse or that could never form, refused naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_server.config.group import DEFAULT_MASTER_PORT, plan_group
from lmi_server.config.schema import ConfigError, build_serving_config
from tests.unit.config.test_tensor_parallel import MODELS, fake_nvidia_smi

LWS = {"LWS_LEADER_ADDRESS": "llm-0.llm.default", "LWS_GROUP_SIZE": "2"}


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def h100s(tmp_path, monkeypatch):
    """8 x H100 80GB on every node."""
    fake_nvidia_smi(tmp_path / "bin", 8, 80)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(8))))


def build(model: str, props: dict[str, str] | None = None, env: dict[str, str] | None = None):
    return build_serving_config(dict(props or {}), MODELS / model, environ=dict(env or {}))


def refused(model: str, props=None, env=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build(model, props, env)
    return info.value.problems


def test_one_node_without_cluster_size_or_lws(cpu):
    cfg = build("Llama-3.1-8B")
    assert cfg.group is None and "nnodes" not in cfg.engine_args


def test_leader_from_lws_gets_vllms_multi_node_arguments(cpu):
    cfg = build("Llama-3.1-8B", env={**LWS, "LWS_WORKER_INDEX": "0"})
    assert cfg.group is not None and cfg.group.role == "leader"
    args = cfg.engine_args
    assert (args["nnodes"], args["node_rank"], args["master_addr"], args["master_port"]) == (
        2, 0, "llm-0.llm.default", DEFAULT_MASTER_PORT)
    assert args["distributed_executor_backend"] == "mp"
    assert args["pipeline_parallel_size"] == 2 and "one pipeline stage per node" in cfg.defaults["pipeline_parallel_size"]
    assert cfg.server.engine_max_restarts == 0  # a dead engine ends the group


def test_worker_from_lws_is_a_headless_rank(cpu):
    cfg = build("Llama-3.1-8B", env={**LWS, "LWS_WORKER_INDEX": "1"})
    plan = cfg.group.describe(cfg.engine_args)
    assert plan["role"] == "worker" and plan["this_node_ranks"] == [1] and not plan["serves_http"]
    assert cfg.engine_args["node_rank"] == 1


def test_cluster_size_alone_makes_a_group_and_matching_lws_agrees(cpu):
    assert build("Llama-3.1-8B", {"option.cluster_size": "2"}).group.size == 2
    cfg = build("Llama-3.1-8B", {"option.cluster_size": "2"}, {**LWS, "LWS_WORKER_INDEX": "0"})
    assert cfg.group.source == "option.cluster_size and LWS_GROUP_SIZE"


def test_cluster_size_that_contradicts_lws_is_refused(cpu):
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "3"}, LWS)
    assert "option.cluster_size=3 does not match LWS_GROUP_SIZE=2" in found and "set option.cluster_size=2" in found


def test_worker_without_leader_address_is_refused(cpu):
    (found,) = refused("Llama-3.1-8B", env={"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"})
    assert "LWS_LEADER_ADDRESS is not set" in found and "set LWS_LEADER_ADDRESS" in found


def test_worker_index_outside_the_group_is_refused(cpu):
    (found,) = refused("Llama-3.1-8B", env={**LWS, "LWS_WORKER_INDEX": "2"})
    assert "ranks 0 to 1" in found


def test_degrees_that_do_not_divide_over_the_nodes_are_refused(cpu):
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "3", "option.pipeline_parallel_degree": "2"})
    assert "2 engine ranks do not divide over 3 nodes" in found and "pipeline_parallel_degree=3" in found


def test_engine_arguments_the_plan_owns_are_refused(cpu):
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "2", "option.node_rank": "1"})
    assert found.startswith("option.node_rank=1: set by the group plan")
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "2", "option.distributed_executor_backend": "ray"})
    assert "multiprocessing backend" in found


def test_master_port_is_the_users_to_choose(cpu):
    cfg = build("Llama-3.1-8B", {"option.cluster_size": "2", "option.master_port": "30000"})
    assert cfg.engine_args["master_port"] == 30000 and cfg.group.membership_port == 30001


def test_tp_within_a_node_pp_across_nodes_on_h100s(h100s):
    cfg = build("Qwen2.5-72B-Instruct", env={**LWS, "LWS_WORKER_INDEX": "0"})
    assert cfg.engine_args["tensor_parallel_size"] == 8 and cfg.engine_args["pipeline_parallel_size"] == 2
    assert cfg.group.describe(cfg.engine_args)["ranks_per_node"] == 8


def test_ranks_past_the_nodes_gpus_are_refused(h100s):
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "2", "option.tensor_parallel_degree": "8",
                                         "option.pipeline_parallel_degree": "4"})
    assert "16 on each node, more than the 8 GPUs visible" in found and "option.cluster_size to 4" in found


def test_degree_16_spans_two_nodes_without_the_single_node_refusal(h100s):
    cfg = build("DeepSeek-V3", {"option.cluster_size": "2", "option.tensor_parallel_degree": "16",
                                "option.pipeline_parallel_degree": "1"})
    assert cfg.engine_args["tensor_parallel_size"] == 16


@pytest.mark.parametrize("raw", ["two", "-1"])
def test_malformed_lws_variables_are_refused(raw):
    _, problems = plan_group(None, {"LWS_GROUP_SIZE": raw})
    assert problems and "LWS_GROUP_SIZE" in problems[0]


def test_lmi_key_is_no_longer_not_applicable():
    from lmi_server.config.lmi_compat import not_applicable_options

    assert "cluster_size" not in not_applicable_options()
    assert Path(__file__).parents[3].joinpath("docs", "multi-node.md").is_file()


def test_lmcache_is_refused_in_a_group(cpu):
    (found,) = refused("Llama-3.1-8B", {"option.cluster_size": "2", "option.lmcache_auto_config": "true"})
    assert "not supported in a multi-node group" in found and "every node" in found
