"""What this server takes from AWS's `model-hosting-container-standards`, imported in one place.

Importing its `sagemaker` package reconfigures the root logger (the level of
SAGEMAKER_CONTAINER_LOG_LEVEL, default ERROR, forced onto every handler too), which would silence
the server's own INFO logs; the logging configuration is restored right after the import.
"""

from __future__ import annotations

import logging


def _import_quietly():
    root = logging.getLogger()
    level, handler_levels = root.level, [(h, h.level) for h in root.handlers]
    try:
        from model_hosting_container_standards.sagemaker.lora.constants import SageMakerLoRAApiHeader
        from model_hosting_container_standards.sagemaker.sessions.models import SageMakerSessionHeader, SessionRequest
    finally:
        root.setLevel(level)
        for handler, handler_level in handler_levels:
            handler.setLevel(handler_level)
    return SageMakerLoRAApiHeader, SageMakerSessionHeader, SessionRequest


SageMakerLoRAApiHeader, SageMakerSessionHeader, SessionRequest = _import_quietly()
ADAPTER_HEADER = SageMakerLoRAApiHeader.ADAPTER_IDENTIFIER.lower()  # x-amzn-sagemaker-adapter-identifier
ALIAS_HEADER = SageMakerLoRAApiHeader.ADAPTER_ALIAS.lower()  # x-amzn-sagemaker-adapter-alias

__all__ = ["ADAPTER_HEADER", "ALIAS_HEADER", "SageMakerLoRAApiHeader", "SageMakerSessionHeader", "SessionRequest"]
