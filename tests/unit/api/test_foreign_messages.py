"""Chat bodies that vLLM validates but cannot render for the served model are a 400, not a 500."""

from types import SimpleNamespace

import pytest

from lmi_server.api.errors import APIError
from lmi_server.api.openai.routes import chat_request_type
from lmi_server.api.pipeline import reject_foreign_messages

pytestmark = pytest.mark.unit

HARMONY = {"author": {"role": "user"}, "content": [{"type": "text", "text": "x"}], "channel": "final"}


def engine_of(model_type, multimodal=False):
    config = SimpleNamespace(hf_config=SimpleNamespace(model_type=model_type), is_multimodal_model=multimodal)
    return SimpleNamespace(engine=SimpleNamespace(model_config=config))


def test_harmony_message_is_refused_for_other_models():
    parsed = chat_request_type().model_validate({"messages": [{"role": "user", "content": "hi"}, HARMONY]})
    with pytest.raises(APIError) as info:
        reject_foreign_messages(parsed, engine_of("llama"))
    assert info.value.status == 400 and "messages[1]" in info.value.message


def test_harmony_message_is_left_to_gpt_oss_and_plain_messages_pass():
    parsed = chat_request_type().model_validate({"messages": [HARMONY]})
    reject_foreign_messages(parsed, engine_of("gpt_oss"))
    plain = chat_request_type().model_validate({"messages": [{"role": "user", "content": "hi"}]})
    reject_foreign_messages(plain, engine_of("llama"))


def test_media_parts_need_a_multimodal_model():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]}
    parsed = chat_request_type().model_validate(body)
    with pytest.raises(APIError) as info:
        reject_foreign_messages(parsed, engine_of("llama"))
    assert info.value.status == 400 and "'input_audio'" in info.value.message
    reject_foreign_messages(parsed, engine_of("qwen2_audio", multimodal=True))
