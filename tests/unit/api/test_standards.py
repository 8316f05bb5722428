"""Taking names from model-hosting-container-standards must not silence the server's logs (its
`sagemaker` package sets the root logger to ERROR when imported)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_api_keeps_the_logging_configuration():
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "import lmi_server.api.app, lmi_server.api.sessions, lmi_server.api.adapters.routing\n"
        "root = logging.getLogger()\n"
        "print(root.level, [h.level for h in root.handlers])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "20 [0]"


def test_sagemaker_header_names_come_from_the_standards_package():
    from lmi_server.api.adapters.routing import ADAPTER_HEADER
    from lmi_server.api.sessions import CLOSED_SESSION_HEADER, NEW_SESSION_HEADER, SESSION_HEADER

    assert ADAPTER_HEADER == "x-amzn-sagemaker-adapter-identifier"
    assert (SESSION_HEADER, NEW_SESSION_HEADER, CLOSED_SESSION_HEADER) == (
        "X-Amzn-SageMaker-Session-Id", "X-Amzn-SageMaker-New-Session-Id", "X-Amzn-SageMaker-Closed-Session-Id",
    )
