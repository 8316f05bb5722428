"""The tensor-parallel degree: LMI's default and `max` pick one vLLM accepts; a given one is checked.

Why: LMI's default (and `option.tensor_parallel_degree=max`) is every visible GPU, which vLLM
refuses for many models (Qwen2.5-7B's 28 heads on 8 GPUs), and a degree whose weights do not fit
the GPUs fails only after minutes of loading. Here the default is the largest degree within the
visible GPUs that vLLM accepts (`tp_rules`): LMI shards over as many GPUs as it can, which gives
each rank the least weights and the KV cache the most memory, so no smaller degree can fit where
it does not. A degree that vLLM would refuse, or whose weights do not fit, is a start-up problem
that names the degrees it accepts or how many GPUs of this size the model needs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmi_server.config.host import GIB, GpuInventory
from lmi_server.config.tp_rules import ShardShape
from lmi_server.config.weights import WeightSize, model_weight_size

KEY = "option.tensor_parallel_degree"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Left on every GPU beside the weights: CUDA context, NCCL buffers and the activation peak, before
# any KV cache. vLLM starts only when some memory is left for the KV cache after all three.
RESERVE_BYTES = 2 * GIB
# Where the search for "how many GPUs it needs" stops.
MAX_DEGREE = 1024


@dataclass
class TensorParallelPlan:
    degree: int | None
    """None: leave vLLM's default (a CPU host, or a model too small to shard)."""
    why: str | None = None
    """Set when the degree was chosen here (LMI's default), for `ServingConfig.defaults`."""
    problems: list[str] = field(default_factory=list)


def read_model_config(model_path: str | None) -> dict[str, Any] | None:
    if not model_path:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


@dataclass(frozen=True)
class Fit:
    """Whether the weights fit the GPUs at a degree, with the numbers that say so."""

    weights: WeightSize
    usable_bytes: int
    inventory: GpuInventory
    utilization: float
    offload_bytes: int

    def per_gpu(self, degree: int, pipeline: int) -> float:
        return self.weights.bytes / (degree * pipeline) - self.offload_bytes

    def fits(self, degree: int, pipeline: int) -> bool:
        return self.per_gpu(degree, pipeline) <= self.usable_bytes

    def budget(self) -> str:
        mem = self.inventory.memory_bytes_each or 0
        offload = f" + {self.offload_bytes / GIB:.1f} GiB offloaded to CPU" if self.offload_bytes else ""
        return (
            f"{self.usable_bytes / GIB:.1f} GiB usable on each {self.inventory.name or 'GPU'} "
            f"({mem / GIB:.1f} GiB x gpu_memory_utilization {self.utilization:g} - {RESERVE_BYTES // GIB} GiB "
            f"for CUDA context and activations{offload})"
        )

    def needs(self, shape: ShardShape | None, pipeline: int) -> str:
        """How many GPUs of this size the model needs: the smallest accepted degree that fits,
        else the largest accepted degree with as many pipeline stages as it takes."""
        degrees = shape.valid_degrees(min(MAX_DEGREE, shape.heads)) if shape else list(range(1, MAX_DEGREE + 1))
        size = f"GPUs of {(self.inventory.memory_bytes_each or 0) / GIB:.1f} GiB ({self.inventory.name or 'GPU'})"
        for d in degrees:
            if self.fits(d, pipeline):
                stages = f" x pipeline_parallel_degree={pipeline}" if pipeline > 1 else ""
                return f"the model needs {d * pipeline} {size}: tensor_parallel_degree={d}{stages}"
        room = self.usable_bytes + self.offload_bytes
        if room <= 0:
            return f"{size} leave no room for weights at gpu_memory_utilization {self.utilization:g}"
        top = degrees[-1]
        stages = max(pipeline, math.ceil(self.weights.bytes / (top * room)))
        return (
            f"the model needs {top * stages} {size}: tensor_parallel_degree={top} (the most vLLM accepts) "
            f"x pipeline_parallel_degree={stages}"
        )


def fit_for(engine_args: Mapping[str, Any], inventory: GpuInventory, weights: WeightSize | None) -> Fit | None:
    """The weights against one GPU of the inventory (usable memory after the reserve); None when
    either is unknown."""
    if weights is None or not inventory.memory_bytes_each:
        return None
    utilization = float(engine_args.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    usable = int(inventory.memory_bytes_each * utilization) - RESERVE_BYTES
    offload = int(float(engine_args.get("cpu_offload_gb") or 0) * GIB)
    return Fit(weights, usable, inventory, utilization, offload)


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _listing(degrees: list[int]) -> str:
    return ", ".join(str(d) for d in degrees) if degrees else "none"


def plan_tensor_parallel(
    engine_args: Mapping[str, Any],
    *,
    requested: str | None,
    inventory: GpuInventory,
    model_path: str | None,
    builtin: bool = False,
) -> TensorParallelPlan:
    """The degree to run with. `requested`: None (unset: LMI's default), "max", "instance:N" (the
    GPU count SageMaker states, a bound like max), or None with `tensor_parallel_size` in
    `engine_args` (a degree the user gave, checked as it is)."""
    given = engine_args.get("tensor_parallel_size") if requested is None else None
    if given is None and requested is None and (inventory.count == 0 or builtin):
        return TensorParallelPlan(None)
    config = read_model_config(model_path)
    shape = ShardShape.from_config(config, engine_args) if config else None
    pipeline = int(engine_args.get("pipeline_parallel_size") or 1)
    data = int(engine_args.get("data_parallel_size") or 1)
    weights = model_weight_size(Path(model_path) if model_path else None, config, engine_args) if config else None
    fit = fit_for(engine_args, inventory, weights) if inventory.count else None
    if given is not None:
        return _check_given(int(given), engine_args, shape, inventory, pipeline, fit)
    return _choose(requested, shape, inventory, pipeline, data, fit)


def _check_given(
    degree: int, engine_args: Mapping[str, Any], shape: ShardShape | None, inventory: GpuInventory,
    pipeline: int, fit: Fit | None,
) -> TensorParallelPlan:
    gpus = inventory.count
    within = f"within the {_gpus(gpus)} visible" if gpus else "(up to its attention heads; this host has no GPU)"
    upto = gpus // pipeline if gpus else (shape.heads if shape else degree)
    problems: list[str] = []
    refused = shape.refusal(degree) if shape else None
    if refused:
        accepted = shape.valid_degrees(upto) if shape else []
        problems.append(f"{KEY}={degree}: vLLM refuses it for this model: {refused}. Degrees it accepts {within}: {_listing(accepted)}")
    elif gpus and degree * pipeline > gpus and _single_node(engine_args):
        accepted = shape.valid_degrees(upto) if shape else list(range(1, upto + 1))
        problems.append(
            f"{KEY}={degree}: {degree} x pipeline {pipeline} engine ranks need more GPUs than the {_gpus(gpus)} visible; "
            f"vLLM refuses it on one node. Degrees it accepts {within}: {_listing(accepted)}"
        )
    elif fit is not None and not fit.fits(degree, pipeline):
        problems.append(_too_big(f"{KEY}={degree}", degree, pipeline, shape, fit))
    return TensorParallelPlan(degree, None, problems)


def _single_node(engine_args: Mapping[str, Any]) -> bool:
    backend = engine_args.get("distributed_executor_backend")
    return backend in (None, "mp", "uni") and int(engine_args.get("nnodes") or 1) <= 1


def _too_big(what: str, degree: int, pipeline: int, shape: ShardShape | None, fit: Fit) -> str:
    per_gpu = fit.per_gpu(degree, pipeline)
    return (
        f"{what}: the model's weights ({fit.weights.bytes / GIB:,.1f} GiB, {fit.weights.source}) take "
        f"{per_gpu / GIB:,.1f} GiB per GPU at this degree, more than the {fit.budget()}; {fit.needs(shape, pipeline)}"
    )


def _choose(
    requested: str | None, shape: ShardShape | None, inventory: GpuInventory, pipeline: int, data: int, fit: Fit | None,
) -> TensorParallelPlan:
    gpus = inventory.count
    if requested and requested.startswith("instance:"):
        bound, source = int(requested.split(":", 1)[1]), "SM_NUM_GPUS"
        gpus = min(gpus, bound) if gpus else bound
    else:
        source = f"{KEY}=max" if requested == "max" else f"LMI's default: {KEY} unset"
    if gpus == 0:
        return TensorParallelPlan(1, f"1: {source} on a host without GPUs")
    others = pipeline * data
    upto = max(1, gpus // others)
    scope = _gpus(gpus) + (f" / {others} pipeline x data parallel ranks" if others > 1 else "")
    if shape is None:
        degree = upto
        why = f"{degree}: every one of the {scope} ({source}; no local config.json to check the model's heads against)"
    else:
        accepted = shape.valid_degrees(upto)
        degree = accepted[-1]
        why = f"{degree}: the largest degree within the {scope} that vLLM accepts for this model ({source})"
        if degree < upto:
            why += f"; {upto} is refused: {shape.refusal(upto)}; accepted: {_listing(accepted)}"
    why += "; LMI's rule: shard over as many GPUs as the model allows (least weights per GPU, most KV cache)"
    problems: list[str] = []
    if fit is None:
        why += "; weights not checked against GPU memory (" + (
            "GPU memory unknown: no nvidia-smi" if not inventory.memory_bytes_each else "the weights' size is unknown"
        ) + ")"
    else:
        if fit.fits(degree, pipeline):
            why += f"; weights {fit.weights.bytes / GIB:,.1f} GiB ({fit.weights.source}) = {fit.per_gpu(degree, pipeline) / GIB:,.1f} GiB per GPU of {fit.usable_bytes / GIB:.1f} GiB usable"
        else:
            chosen = f"{KEY} ({source}: {degree}, the largest degree vLLM accepts on {inventory.describe()})"
            problems.append(_too_big(chosen, degree, pipeline, shape, fit))
    why += f"; set {KEY} to choose"
    return TensorParallelPlan(degree, why, problems)
