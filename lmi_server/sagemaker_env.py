"""Whether this server runs on SageMaker, read from the environment SageMaker gives a container.

Why one place: several defaults differ there (caches on the instance's NVMe volume at /tmp, the
adapter roots SageMaker may name in `src`, the ports a container may open), and each must agree on
what "SageMaker" means. SageMaker hosting sets `SAGEMAKER_*` variables for the container (the port
range beside the serving port, the port to bind in an inference pipeline); the SageMaker Python
SDK sets more of them in the model's environment (log level, region, program). Any of them says
SageMaker. `LMI_ON_SAGEMAKER=true|false` overrides the guess either way (a local test of the
SageMaker layout, or a SageMaker-like platform that is not one). Imports nothing of the server's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

OVERRIDE = "LMI_ON_SAGEMAKER"
MARKERS = (
    "SAGEMAKER_SAFE_PORT_RANGE",  # hosting: the ports a container may open beside its serving port
    "SAGEMAKER_BIND_TO_PORT",  # hosting: the serving port of a container in an inference pipeline
    "SAGEMAKER_CONTAINER_LOG_LEVEL",  # the SageMaker Python SDK, every framework model
    "SAGEMAKER_REGION",  # the SageMaker Python SDK
    "SAGEMAKER_PROGRAM",  # the SageMaker Python SDK (entry point scripts)
    "SAGEMAKER_INFERENCE_COMPONENT_NAME",
)
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


def on_sagemaker(env: Mapping[str, str] | None = None) -> bool:
    """True when the environment is SageMaker's (`LMI_ON_SAGEMAKER` decides when it is set)."""
    env = os.environ if env is None else env
    forced = env.get(OVERRIDE, "").strip().lower()
    if forced in TRUE:
        return True
    if forced in FALSE:
        return False
    return any(env.get(name, "").strip() for name in MARKERS)


def why(env: Mapping[str, str] | None = None) -> str:
    """The variable that made `on_sagemaker` true, for log lines and plan reasons."""
    env = os.environ if env is None else env
    if env.get(OVERRIDE, "").strip().lower() in TRUE:
        return f"{OVERRIDE}=true"
    found = next((name for name in MARKERS if env.get(name, "").strip()), None)
    return f"{found} is set" if found else "not SageMaker"
