"""From a validated ServingConfig to what the process runs (`resolve_runtime` -> `Runtime`).

One module per step: `resolve` (the order), `defaults`, `speculative`, `engine_memory`, `kv_plan`,
`blend`, `fair_slots`, `frontend`, `checks`, `remote`, `model_files`; `result` holds the Runtime.
"""

from __future__ import annotations

from lmi_server.config import host
from lmi_server.runtime.blend import blend_settings, blend_store_dir, plan_blend
from lmi_server.runtime.defaults import builtin_defaults, builtin_tool_defaults, cpu_scheduler_defaults, vision_defaults
from lmi_server.runtime.engine_memory import default_engine_memory, loaded_weight_bytes, user_sized_engine_memory
from lmi_server.runtime.fair_slots import fair_headroom
from lmi_server.runtime.frontend import resolve_frontend_args
from lmi_server.runtime.kv_plan import plan_kv_cache
from lmi_server.runtime.model_files import kv_dtype, longest_sequence_kv_bytes
from lmi_server.runtime.remote import fetch_remote
from lmi_server.runtime.resolve import resolve_runtime
from lmi_server.runtime.result import Runtime
from lmi_server.runtime.speculative import builtin_draft, resolve_speculative

__all__ = [
    "Runtime", "blend_settings", "blend_store_dir", "builtin_defaults", "builtin_draft", "builtin_tool_defaults",
    "cpu_scheduler_defaults", "default_engine_memory", "fair_headroom", "fetch_remote", "host", "kv_dtype",
    "loaded_weight_bytes", "longest_sequence_kv_bytes", "plan_blend", "plan_kv_cache", "resolve_frontend_args",
    "resolve_runtime", "resolve_speculative", "user_sized_engine_memory", "vision_defaults",
]
