"""What a chat message may make the server fetch or decode: every hostile image input is a 400 that
says why, before anything is fetched or decoded in full."""

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from lmi_server.api.errors import APIError
from lmi_server.api.media import DEFAULT_MAX_IMAGES, MediaPolicy, check_messages

pytestmark = pytest.mark.unit


def png(width=32, height=32, colour=(255, 0, 0)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, format="PNG")
    return buf.getvalue()


def data_url(raw: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def chat(*urls, kind="image_url"):
    parts = [{"type": "text", "text": "What colour is the shape?"}]
    parts += [{"type": kind, kind: {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def refused(messages, policy=MediaPolicy()) -> str:
    with pytest.raises(APIError) as err:
        check_messages(messages, policy)
    assert err.value.status == 400
    return err.value.message


def huge_declared_png(width=100_000, height=100_000) -> bytes:
    """A tiny file whose header declares 10 billion pixels (a decompression bomb's shape)."""
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def test_a_small_data_image_passes():
    check_messages(chat(data_url(png())), MediaPolicy())
    check_messages([{"role": "user", "content": [{"type": "input_image", "image_url": data_url(png())}]}], MediaPolicy())


def test_text_only_messages_pass():
    check_messages([{"role": "user", "content": "hello"}, {"role": "assistant", "content": None}], MediaPolicy())


def test_a_url_is_not_fetched_unless_its_host_is_allowed():
    assert "fetches no URLs" in refused(chat("http://127.0.0.1:9/red.png"))
    allowed = MediaPolicy(allowed_domains=frozenset({"images.example.com"}))
    check_messages(chat("https://images.example.com/red.png"), allowed)
    assert "not in option.allowed_media_domains" in refused(chat("http://169.254.169.254/latest/meta-data"), allowed)


@pytest.mark.parametrize("url", ["/etc/passwd", "file:///etc/passwd", "ftp://example.com/a.png", "../model/config.json"])
def test_local_paths_and_other_schemes_are_refused(url):
    assert "only data: URLs" in refused(chat(url))


def test_an_image_over_the_byte_limit_is_refused_before_decoding():
    message = refused(chat("data:image/png;base64," + "A" * (50 * 1024 * 1024 // 3 * 4)))
    assert "option.max_image_bytes" in message


def test_a_truncated_png_is_refused():
    raw = png(64, 64)
    assert "cannot be decoded" in refused(chat(data_url(raw[: len(raw) // 2])))


def test_a_huge_pixel_image_is_refused_from_its_header():
    assert "option.max_image_pixels" in refused(chat(data_url(huge_declared_png())))
    assert "5000x5000 pixels" in refused(chat(data_url(huge_declared_png(5000, 5000))))


def test_bytes_that_are_no_image_and_bad_base64_are_refused():
    assert "not an image" in refused(chat(data_url(b"PK\x03\x04 not an image at all")))
    assert "not valid base64" in refused(chat("data:image/png;base64,@@@@"))
    assert "must be base64" in refused(chat("data:image/png,rawbytes"))


def test_too_many_images_in_one_request():
    one = data_url(png(8, 8))
    check_messages(chat(*[one] * DEFAULT_MAX_IMAGES), MediaPolicy())
    assert "option.limit_mm_per_prompt" in refused(chat(*[one] * 100))
    policy = MediaPolicy.from_options(allowed_domains=None, max_image_bytes=10**6, max_image_pixels=10**6,
                                      limit_mm_per_prompt={"image": 2})
    assert "more than 2" in refused(chat(one, one, one), policy)


def test_embeddings_and_objects_are_refused():
    message = [{"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}]
    assert "not accepted" in refused(message)
    assert "needs a URL" in refused([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}])


def test_video_and_audio_urls_follow_the_same_host_rule():
    assert "fetches no URLs" in refused(chat("http://127.0.0.1/v.mp4", kind="video_url"))
