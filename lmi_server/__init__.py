"""lmi_server: an LMI-style LLM serving container on vLLM and LMCache."""

__version__ = "0.1.0"
