"""A multi-node group from `option.cluster_size` and the LeaderWorkerSet environment.

Why: a model larger than one node runs as one vLLM engine over several nodes (vLLM's
multiprocessing backend: `nnodes`, `node_rank`, `master_addr`, `master_port`; the nodes past the
first run vLLM's headless workers). LeaderWorkerSet gives every pod of a group `LWS_LEADER_ADDRESS`,
`LWS_GROUP_SIZE` and `LWS_WORKER_INDEX`; LMI users say `option.cluster_size`. This module turns
both into one plan (who leads, which rank this node is, the engine arguments vLLM needs) and
refuses, before anything starts, a group that vLLM would refuse or that could never form, naming
the fix. Pure: no vLLM import, no network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmi_server.config.host import GpuInventory
from lmi_server.config.options import ServerOptions

LEADER_ADDRESS, GROUP_SIZE, WORKER_INDEX = "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"
# vLLM's own default for master_port (ParallelConfig.master_port): the leader's torch.distributed store.
DEFAULT_MASTER_PORT = 29501
# Backends that run one engine across nodes with nnodes/node_rank (ParallelConfig's check).
MULTI_NODE_BACKENDS = ("mp",)


@dataclass(frozen=True)
class GroupPlan:
    """One node's part in a multi-node group."""

    size: int
    rank: int
    leader_address: str
    master_port: int
    source: str
    """Where the size came from: option.cluster_size, LWS_GROUP_SIZE or both."""

    @property
    def membership_port(self) -> int:
        """The leader's port where every worker reports in and stays connected (`lmi_server.group`),
        next to vLLM's master_port."""
        return self.master_port + 1

    @property
    def role(self) -> str:
        return "leader" if self.rank == 0 else "worker"

    def inventory(self, node: GpuInventory) -> GpuInventory:
        """The group's GPUs, each node taken to have this node's (LeaderWorkerSet pods share one template)."""
        return GpuInventory(node.count * self.size, node.memory_bytes_each, node.name) if node.count else node

    def engine_args(self) -> dict[str, Any]:
        """vLLM's arguments for this node (its multiprocessing backend across nodes)."""
        return {
            "nnodes": self.size, "node_rank": self.rank, "master_addr": self.leader_address,
            "master_port": self.master_port, "distributed_executor_backend": "mp",
        }

    def describe(self, engine_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        engine_args = engine_args or {}
        tp = int(engine_args.get("tensor_parallel_size") or 1)
        pp = int(engine_args.get("pipeline_parallel_size") or 1)
        world = tp * pp * int(engine_args.get("data_parallel_size") or 1)
        return {
            "nodes": self.size, "this_node": self.rank, "role": self.role, "size_from": self.source,
            "leader_address": self.leader_address, "master_port": self.master_port,
            "membership_port": self.membership_port, "mechanism": "vLLM multiprocessing backend (nnodes/node_rank)",
            "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "engine_ranks": world,
            "ranks_per_node": world // self.size if self.size else world,
            "this_node_ranks": [self.rank * (world // self.size) + i for i in range(world // self.size)]
            if self.size and world % self.size == 0 else [],
            "serves_http": self.role == "leader",
        }


def _int_env(environ: Mapping[str, str], name: str, problems: list[str]) -> int | None:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{name}={raw!r}: expected a whole number (LeaderWorkerSet sets it)")
        return None
    if value < 0:
        problems.append(f"{name}={raw!r}: must not be negative")
        return None
    return value


def plan_group(
    cluster_size: int | None, environ: Mapping[str, str], *, master_port: int | None = None,
) -> tuple[GroupPlan | None, list[str]]:
    """The group this node belongs to, or None for one node; with the problems that forbid it."""
    problems: list[str] = []
    lws_size = _int_env(environ, GROUP_SIZE, problems)
    index = _int_env(environ, WORKER_INDEX, problems)
    leader = (environ.get(LEADER_ADDRESS) or "").strip() or None
    if cluster_size is not None and lws_size is not None and cluster_size != lws_size:
        problems.append(
            f"option.cluster_size={cluster_size} does not match {GROUP_SIZE}={lws_size} (the LeaderWorkerSet's "
            f"size): set option.cluster_size={lws_size}, or leave it unset and the group size is read from "
            f"{GROUP_SIZE}"
        )
        return None, problems
    size = cluster_size if cluster_size is not None else lws_size
    source = " and ".join(n for n, v in (("option.cluster_size", cluster_size), (GROUP_SIZE, lws_size)) if v is not None)
    if problems or size is None or size <= 1:
        if size == 0:
            problems.append(f"{GROUP_SIZE}=0: a group has at least one node")
        if index and (size or 1) <= 1:
            problems.append(
                f"{WORKER_INDEX}={index} on a one-node deployment: set option.cluster_size to the group's size "
                f"(or run under a LeaderWorkerSet, which sets {GROUP_SIZE})"
            )
        return None, problems
    rank = index or 0
    if rank >= size:
        problems.append(f"{WORKER_INDEX}={rank}: a group of {size} nodes has ranks 0 to {size - 1}")
    if rank > 0 and leader is None:
        problems.append(
            f"this node is rank {rank} of a group of {size} ({WORKER_INDEX}={rank}) but {LEADER_ADDRESS} is not set: "
            f"a worker must know its leader; set {LEADER_ADDRESS} to the leader's address (LeaderWorkerSet sets it "
            "in every pod of the group)"
        )
    if problems:
        return None, problems
    return GroupPlan(
        size=size, rank=rank, leader_address=leader or "127.0.0.1",
        master_port=master_port or DEFAULT_MASTER_PORT, source=source,
    ), []


def check_keys(plan: GroupPlan, engine_args: Mapping[str, Any], lmcache: Any = None) -> list[str]:
    """Engine arguments given beside the group that contradict it; LMCache, which a group cannot run:
    vLLM runs the KV connector's worker side in every rank on every node, and the cache server this
    server starts runs beside the leader only."""
    problems: list[str] = []
    if lmcache is not None and (lmcache.lmcache_config_file or lmcache.lmcache_auto_config):
        problems.append(
            "option.lmcache_config_file / option.lmcache_auto_config (or an LMCache kv_transfer_config): not "
            f"supported in a multi-node group ({plan.size} nodes): vLLM runs the KV connector in every rank, on "
            "every node, and the LMCache cache server runs beside the leader only; remove them (vLLM's own "
            "prefix cache still works)"
        )
    backend = engine_args.get("distributed_executor_backend")
    if backend not in (None, *MULTI_NODE_BACKENDS):
        problems.append(
            f"option.distributed_executor_backend={backend!r}: a group here runs vLLM's multiprocessing backend "
            "across nodes (nnodes/node_rank; Ray is not installed in this image); leave it unset or set mp"
        )
    for key in ("nnodes", "node_rank", "master_addr"):
        given = engine_args.get(key)
        if given is not None and given != plan.engine_args()[key]:
            problems.append(
                f"option.{key}={given!r}: set by the group plan ({plan.engine_args()[key]!r}, from option.cluster_size "
                f"and the LeaderWorkerSet variables); remove it"
            )
    return problems


def check_degrees(plan: GroupPlan, engine_args: Mapping[str, Any], gpus_per_node: int) -> list[str]:
    """What vLLM would refuse about this group once the degrees are known, with the fix."""
    problems: list[str] = []
    tp = int(engine_args.get("tensor_parallel_size") or 1)
    pp = int(engine_args.get("pipeline_parallel_size") or 1)
    dp = int(engine_args.get("data_parallel_size") or 1)
    world = tp * pp * dp
    if world % plan.size:
        fix = f"pipeline_parallel_degree={plan.size}" + (f" with tensor_parallel_degree={gpus_per_node}" if gpus_per_node else "")
        problems.append(
            f"tensor_parallel_degree {tp} x pipeline_parallel_degree {pp}"
            + (f" x data_parallel_size {dp}" if dp > 1 else "")
            + f" = {world} engine ranks do not divide over {plan.size} nodes (vLLM requires the nodes to divide "
            f"the world size); for instance {fix} (TP within a node, PP across nodes)"
        )
    elif gpus_per_node and world // plan.size > gpus_per_node:
        problems.append(
            f"{world} engine ranks over {plan.size} nodes put {world // plan.size} on each node, more than the "
            f"{gpus_per_node} GPUs visible on this node; lower the degrees or raise option.cluster_size to "
            f"{-(-world // gpus_per_node)}"
        )
    return problems


def apply_group(group: GroupPlan, engine_args: dict[str, Any], server: ServerOptions) -> tuple[ServerOptions, dict[str, str]]:
    """vLLM's multi-node arguments, and LMI's defaults for a group: one pipeline stage per node
    (tensor parallelism stays within a node, where GPUs talk fastest); no in-process engine
    rebuild (the other nodes' workers end with the engine, so the group restarts as a whole)."""
    engine_args.update(group.engine_args())
    why: dict[str, str] = {}
    if "pipeline_parallel_size" not in engine_args:
        engine_args["pipeline_parallel_size"] = group.size
        why["pipeline_parallel_size"] = (
            f"{group.size}: one pipeline stage per node of the group ({group.source}); tensor parallelism stays "
            "within a node; set option.pipeline_parallel_degree to choose"
        )
    if server.engine_max_restarts:
        server = server.model_copy(update={"engine_max_restarts": 0})
        why["engine_max_restarts"] = "0 in a multi-node group: a dead engine ends the group, which restarts as a whole"
    return server, why
