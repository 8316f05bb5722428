"""The import surface that LMI's documented `model.py` files use, so that they run unchanged.

A compatibility package of lmi_server (not LMI's code): the decorators only mark functions, and
the few types LMI's examples import exist with the methods those examples call. The server finds
the marked functions in a model directory's or an adapter's `model.py` and applies them with the
semantics of LMI's vLLM handler (see lmi_server/adapters/formatters.py).
"""

from djl_python.inputs import Input
from djl_python.outputs import Output

__all__ = ["Input", "Output"]
