"""How many nodes a model needs, and the degrees to run it with, before any weights are read.

Why: the seed's largest models do not fit one node of the GPUs most users have (DeepSeek-V3's FP8
weights are about 640 GiB, one 8 x H100 node holds 8 x 69.6 GiB usable), and a group too small
for the weights fails only after every node has loaded its share. From config.json (and the local
safetensors' size where there) and the GPUs of one node, this plans: tensor parallelism within a
node (the largest degree vLLM accepts up to the node's GPUs, `tp_rules`), one pipeline stage per
node, and as many nodes as the weights need; for MoE models also the expert-parallel variant vLLM
supports (tensor parallelism over the whole group with `enable_expert_parallel`, experts whole on
each rank), where the model's heads split over the group's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmi_server.config.host import GIB, MIB, GpuInventory
from lmi_server.config.tensor_parallel import Fit, fit_for, read_model_config
from lmi_server.config.tp_rules import ShardShape
from lmi_server.config.weights import model_weight_size, text_config

# The nodes users run big models on: what `nvidia-smi` says of each GPU (name, MiB).
REFERENCE_NODES = {
    "8 x H100 80GB": GpuInventory(8, 81559 * MIB, "NVIDIA H100 80GB HBM3"),
    "8 x H200 141GB": GpuInventory(8, 143771 * MIB, "NVIDIA H200"),
}
MAX_NODES = 64


@dataclass(frozen=True)
class NodesPlan:
    node: str
    nodes: int | None
    """None: not even MAX_NODES nodes hold the weights, or the model cannot be sharded here."""
    tensor_parallel: int
    pipeline_parallel: int
    weights_gib: float
    per_gpu_gib: float | None
    usable_gib: float
    expert_parallel: str | None = None
    why: str = ""

    def properties(self) -> dict[str, str]:
        """The keys that run this plan."""
        if self.nodes is None:
            return {}
        props = {"option.tensor_parallel_degree": str(self.tensor_parallel),
                 "option.pipeline_parallel_degree": str(self.pipeline_parallel)}
        if self.nodes > 1:
            props["option.cluster_size"] = str(self.nodes)
        return props

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "nodes": self.nodes, "tensor_parallel_degree": self.tensor_parallel,
            "pipeline_parallel_degree": self.pipeline_parallel, "weights_gib": round(self.weights_gib, 1),
            "per_gpu_gib": None if self.per_gpu_gib is None else round(self.per_gpu_gib, 1),
            "usable_gib_per_gpu": round(self.usable_gib, 1), "properties": self.properties(),
            "expert_parallel": self.expert_parallel, "why": self.why,
        }


def _is_moe(config: Mapping[str, Any]) -> bool:
    cfg = text_config(config)
    return any(isinstance(cfg.get(k), int) and cfg.get(k) > 1 for k in ("n_routed_experts", "num_local_experts", "num_experts"))


def kv_floor_bytes(config: Mapping[str, Any], engine_args: Mapping[str, Any], tp: int, pp: int) -> int:
    """KV bytes of one max_model_len sequence on each GPU: vLLM refuses to start when its KV cache
    cannot hold one. Pipeline stages split the layers; tensor parallelism splits KV heads (up to
    their number) and keeps MLA's one latent per layer whole on every rank. (The full footprint,
    sliding windows included, is `kvcache.footprint`'s; a bound for planning needs no more.)"""
    cfg = text_config(config)
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    if not isinstance(layers, int) or not isinstance(heads, int) or heads <= 0:
        return 0
    dtype = str(engine_args.get("kv_cache_dtype") or "auto")
    width = 1 if dtype.startswith("fp8") else 4 if engine_args.get("dtype") == "float32" else 2
    if isinstance(cfg.get("kv_lora_rank"), int):
        per_token, split = (cfg["kv_lora_rank"] + int(cfg.get("qk_rope_head_dim") or 0)) * width * layers, 1
    else:
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size") or 0) // heads)
        per_token, split = 2 * kv_heads * head_dim * width * layers, max(1, min(tp, kv_heads))
    tokens = int(engine_args.get("max_model_len") or cfg.get("max_position_embeddings") or 4096)
    return tokens * per_token // (pp * split)


def plan_nodes(config: Mapping[str, Any], engine_args: Mapping[str, Any], node: GpuInventory, label: str,
               model_dir: Path | None = None) -> NodesPlan | None:
    """The smallest group of `node`s that holds the weights; None where the weights' size is unknown."""
    weights = model_weight_size(model_dir, config, engine_args)
    fit = fit_for(engine_args, node, weights)
    if fit is None:
        return None
    shape = ShardShape.from_config(config, engine_args)
    accepted = shape.valid_degrees(node.count) if shape else list(range(1, node.count + 1))
    tp = accepted[-1]
    gib = fit.weights.bytes / GIB
    for nodes in range(1, MAX_NODES + 1):
        kv = kv_floor_bytes(config, engine_args, tp, nodes)
        if fit.per_gpu(tp, nodes) + kv <= fit.usable_bytes:
            return NodesPlan(
                label, nodes, tp, nodes, gib, fit.per_gpu(tp, nodes) / GIB, fit.usable_bytes / GIB,
                _expert_parallel(config, engine_args, shape, fit, nodes, node.count),
                f"{gib:,.1f} GiB of weights ({fit.weights.source}) over {nodes} node(s) x {tp} GPUs = "
                f"{fit.per_gpu(tp, nodes) / GIB:,.1f} GiB per GPU + {kv / GIB:,.1f} GiB for the KV of one "
                f"max_model_len sequence, of {fit.usable_bytes / GIB:.1f} GiB usable; tensor parallelism within "
                "a node, one pipeline stage per node",
            )
    return NodesPlan(label, None, tp, MAX_NODES, gib, None, fit.usable_bytes / GIB,
                     why=f"{gib:,.1f} GiB of weights do not fit {MAX_NODES} nodes of {label}")


def _expert_parallel(config: Mapping[str, Any], engine_args: Mapping[str, Any], shape: ShardShape | None,
                     fit: Fit, nodes: int, gpus: int) -> str | None:
    """The expert-parallel variant: one tensor-parallel group over every GPU of the group, experts
    kept whole (vLLM's enable_expert_parallel), where vLLM accepts that degree for the model."""
    if not _is_moe(config):
        return None
    degree = nodes * gpus
    ep_shape = ShardShape.from_config(config, {**engine_args, "enable_expert_parallel": True})
    refused = ep_shape.refusal(degree) if ep_shape else None
    if refused:
        return f"not at tensor_parallel_degree={degree}: {refused}"
    props = f"option.tensor_parallel_degree={degree} option.pipeline_parallel_degree=1 option.enable_expert_parallel=true"
    return props + (f" option.cluster_size={nodes}" if nodes > 1 else "")


def nodes_needed(model_path: str | None, engine_args: Mapping[str, Any],
                 nodes: Mapping[str, GpuInventory] = REFERENCE_NODES) -> list[dict[str, Any]] | None:
    """The plan on each reference node (what `lmi-server config` shows); None without a local config.json."""
    config = read_model_config(model_path)
    if config is None:
        return None
    plans = [plan_nodes(config, engine_args, inv, label, Path(model_path) if model_path else None)
             for label, inv in nodes.items()]
    return [p.to_dict() for p in plans if p is not None] or None


def check_cluster_holds_weights(size: int, model_path: str | None, engine_args: Mapping[str, Any],
                                node: GpuInventory) -> str | None:
    """A problem when `size` nodes like this one cannot hold the weights, naming the size that can."""
    config = read_model_config(model_path)
    if config is None or not node.count or not node.memory_bytes_each:
        return None
    plan = plan_nodes(config, engine_args, node, node.describe(), Path(model_path) if model_path else None)
    if plan is None or (plan.nodes is not None and plan.nodes <= size):
        return None
    need = f"{plan.nodes} nodes can: set option.cluster_size={plan.nodes} (the LeaderWorkerSet's size)" if plan.nodes else plan.why
    return (
        f"option.cluster_size={size}: {size} node(s) of {node.describe()} cannot hold the model's weights "
        f"({plan.weights_gib:,.1f} GiB) and the KV of one max_model_len sequence, without which vLLM refuses to "
        f"start ({plan.usable_gib:.1f} GiB usable per GPU); {need}, or lower option.max_model_len"
    )


def group_hint(model_path: str | None, engine_args: Mapping[str, Any], node: GpuInventory) -> str:
    """For a model too big for this node: the group of such nodes that holds it ("" where none is known)."""
    config = read_model_config(model_path)
    if config is None or not node.count or not node.memory_bytes_each:
        return ""
    plan = plan_nodes(config, engine_args, node, node.describe(), Path(model_path) if model_path else None)
    if plan is None or plan.nodes is None or plan.nodes < 2:
        return ""
    return (f"; or serve it over {plan.nodes} nodes like this one: option.cluster_size={plan.nodes} "
            f"(tensor_parallel_degree={plan.tensor_parallel} x pipeline_parallel_degree={plan.pipeline_parallel}; "
            "docs/multi-node.md)")
