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


@pytest.mark.parametrize("part", [
    {"video_url": {"url": "http://x/v.mp4"}},  # no type: vLLM reads the media field
    {"type": "text", "text": "hi", "uuid": "u1", "image_embeds": None},  # a uuid: the same rule
])
def test_a_part_vllm_reads_as_media_by_its_fields_needs_a_multimodal_model(part):
    """The fuzzer's 500: a part without a `type` but with a media field is media to vLLM."""
    messages = [{"role": "user", "content": [part]}]
    with pytest.raises(APIError) as info:
        reject_foreign_messages(SimpleNamespace(messages=messages), engine_of("llama"))
    assert info.value.status == 400 and "needs a multimodal model" in info.value.message
    reject_foreign_messages(SimpleNamespace(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]), engine_of("llama"))
