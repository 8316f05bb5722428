"""What fair admission (`option.admission_policy=fair`) asks of the engine: reserved slots added to its
batch size, and the scheduler that gives the first prefill of a tenant under its share a step of its own."""

from __future__ import annotations

from typing import Any

from lmi_server.admission.policy import default_reserved_slots, policy_named
from lmi_server.config.schema import ServingConfig


def fair_headroom(cfg: ServingConfig, engine_args: dict[str, Any], notes: list[str]) -> dict[str, int] | None:
    """Fair admission's reserved slots on top of a batch size the user set: the engine runs
    batch + reserved sequences and one tenant holds at most `batch`. Why: running streams cannot be
    preempted, so slots kept free for newcomers must come from somewhere; carved out of the batch
    they cost a lone flood its throughput, added to it they cost only the memory of a few more
    sequences (KV is sized by memory, not by max_num_seqs). Where no batch size is set, vLLM's
    default stays the engine's and admission carves the reserve out of it."""
    tenants = cfg.tenants
    batch = engine_args.get("max_num_seqs")
    if not policy_named(tenants.admission_policy).keeps_headroom or batch is None:
        return None
    batch = int(batch)
    reserved = tenants.reserved_slots if tenants.reserved_slots is not None else default_reserved_slots(batch)
    if reserved <= 0:
        return None
    engine_args["max_num_seqs"] = batch + reserved
    notes.append(
        f"fair admission: the engine runs max_num_seqs {batch} + option.reserved_slots {reserved} = {batch + reserved}; "
        f"one tenant holds at most {batch}, the other {reserved} start other tenants' requests at once"
    )
    return {"batch_size": batch, "reserved_slots": reserved, "engine_max_num_seqs": batch + reserved}


TENANT_SCHEDULER = "lmi_server.tenant_scheduler.TenantPrefillScheduler"


def tenant_scheduler(cfg: ServingConfig, engine_args: dict[str, Any], notes: list[str]) -> None:
    """vLLM's scheduler_cls for option.tenant_prefill_step under a policy that keeps headroom:
    admission lets another tenant's request in at once, this scheduler then keeps a flood's decodes
    out of its first step. A scheduler_cls the user set is kept."""
    tenants = cfg.tenants
    if not tenants.tenant_prefill_step or not policy_named(tenants.admission_policy).keeps_headroom:
        return
    if engine_args.get("scheduler_cls"):
        notes.append("option.scheduler_cls is set: option.tenant_prefill_step leaves vLLM's scheduler to it")
        return
    engine_args["scheduler_cls"] = TENANT_SCHEDULER
    notes.append("fair admission: the first prefill of a tenant under its share gets an engine step of its own "
                 "(option.tenant_prefill_step)")
