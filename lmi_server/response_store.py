"""A bounded store for the Responses API's `store` / `previous_response_id`.

vLLM's `OpenAIServingResponses` keeps stored responses and their input messages in plain dicts that
grow forever, and only when `VLLM_ENABLE_RESPONSES_API_STORE` is set. Here the same serving object
gets LRU dicts of a fixed size instead (`option.responses_store_size`; 0 leaves storing off): a
conversation continued by `previous_response_id` keeps working, and memory stays bounded, the
least recently used response going first. No FastAPI and no vLLM import: the engine wires it, through `compat.vllm`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from lmi_server.compat import vllm as compat_vllm


class BoundedStore(OrderedDict):
    """A dict of at most `size` entries; reading or writing an entry makes it the newest, and a
    write past the size drops the least recently used."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


def install(serving_responses: Any, size: int) -> bool:
    """Give vLLM's Responses serving object bounded stores of `size` responses (True), or leave
    storing off when `size` is 0 or there is no such object (a model that does not generate)."""
    if serving_responses is None or size <= 0:
        return False
    compat_vllm.bound_responses_store(serving_responses, lambda: BoundedStore(size))
    return True
