"""Admission in front of the engine: which request gets an engine slot, when, and for which tenant.

No HTTP here (no FastAPI/Starlette): policies registered by name (`policy.py`), the fair waiting
queue (`queue.py`), the admission controller with its slot headroom and wait bound
(`controller.py`), tenants and priorities (`tenants.py`), per-tenant rate limits (`limits.py`).
The HTTP layer (`api/admit.py`) calls it once per generating request.
"""

from lmi_server.admission.controller import REJECTED, Admission, BadPriority, Rejected, Ticket, count
from lmi_server.admission.limits import Decision, Limits, RateLimiter, TokenBucket
from lmi_server.admission.policy import POLICIES, AdmissionPolicy, policy_named, register
from lmi_server.admission.queue import DEFAULT_TENANT, Entry, FairQueue
from lmi_server.admission.tenants import Tenants, body_priority, estimate_tokens, parse_priority

__all__ = [
    "REJECTED", "Admission", "BadPriority", "Rejected", "Ticket", "count", "Decision", "Limits", "RateLimiter",
    "TokenBucket", "POLICIES", "AdmissionPolicy", "policy_named", "register", "DEFAULT_TENANT", "Entry", "FairQueue",
    "Tenants", "body_priority", "estimate_tokens", "parse_priority",
]
