"""The `tenants` option section: fair admission between tenants (API keys, else adapters), their
weights, rate limits and the slots kept free for newcomers. Kept beside `options`, which lists it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmi_server.admission.policy import POLICIES, default_reserved_slots  # noqa: F401 - re-exported


class TenantOptions(BaseModel):
    """Tenants, fair admission, priorities and per-tenant rate limits (see docs/tenants.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admission_policy: str = Field(
        "fair",
        description="How waiting requests get engine slots: fair (tenants in turn, weighted, priority first, "
        "FIFO within a tenant) or fifo (one arrival order for all, priority first); any policy registered in "
        "lmi_server/admission/policy.py.",
    )
    @field_validator("admission_policy")
    @classmethod
    def _registered_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown admission policy {value!r}; registered: {', '.join(sorted(POLICIES))}")
        return value

    tenant_header: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="Request header that names the tenant (e.g. x-tenant-id) of a request that has neither a "
        "named API key nor an adapter. Unset: such requests share one tenant, `default`.",
    )
    tenant_weights: dict[str, float] = Field(
        {},
        description="Weights of the fair policy, `name:weight,...` (e.g. `pirate:3,shouter:1`); others weigh 1. "
        "A key file entry may carry its own `weight=`.",
    )
    tenant_queue_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of option.job_queue_size that one tenant's waiting requests may fill; past it that "
        "tenant gets 429 with Retry-After while others still get in. 1: no per-tenant bound.",
    )
    reserved_slots: int | None = Field(
        None,
        ge=0,
        description="Fair policy: engine slots kept for the tenants within their share. Where the batch size is "
        "set (option.max_rolling_batch_size / max_num_seqs) the engine runs that many plus these, and one tenant "
        "holds at most the batch size: a flood keeps the throughput it has alone while another tenant's request "
        "starts at once. Where it is not set, they come out of vLLM's default. While other tenants are present "
        "(requests in flight or waiting, or one in the last 60 s), a tenant beyond its weighted share takes a "
        "free slot only if this many stay free. Default: max(2, batch size // 8); 0: none.",
    )
    tenant_prefill_step: bool = Field(
        True,
        description="Fair policy: the first prefill of a tenant (API key, else adapter) that runs fewer than an "
        "equal share of the engine's running requests gets an engine step of its own: the running requests skip "
        "one decode step (never two steps in a row), so its first token does not wait behind a flood's decodes "
        "(lmi_server/tenant_scheduler.py, named as vLLM's scheduler_cls). false: vLLM's scheduler unchanged.",
    )
    tenant_requests_per_second: float | None = Field(
        None,
        gt=0,
        description="Requests per second each tenant may send (bursts up to one second's worth, at least 1); "
        "past it 429 with Retry-After and x-ratelimit-* headers. A key file entry may carry its own "
        "`requests_per_second=`. Default: no limit.",
    )
    tenant_tokens_per_minute: int | None = Field(
        None,
        gt=0,
        description="Tokens per minute each tenant may use (prompt estimated as characters/4, plus the "
        "requested max tokens, charged at admission; bursts up to a minute's worth); past it 429. A key file "
        "entry may carry its own `tokens_per_minute=`. Default: no limit.",
    )

    metrics_max_tenants: int = Field(
        20,
        ge=1,
        le=1000,
        description="Distinct tenant names that get their own label in /metrics (the first seen); later "
        "ones are counted as tenant=\"other\", so /metrics stays bounded.",
    )
    metrics_max_adapters: int = Field(
        20,
        ge=1,
        le=1000,
        description="Distinct adapter names that get their own label in /metrics (the first seen; the base "
        "model is always adapter=\"base\"); later ones are counted as adapter=\"other\".",
    )

    @field_validator("tenant_weights", mode="before")
    @classmethod
    def _parse_weights(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        weights: dict[str, float] = {}
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            name, sep, weight = part.rpartition(":")
            try:
                number = float(weight)
            except ValueError:
                number = -1.0
            if not sep or not name.strip() or not number > 0:
                raise ValueError(f"expected name:weight pairs with positive weights, e.g. pirate:3,shouter:1 (got {part!r})")
            weights[name.strip()] = number
        return weights
