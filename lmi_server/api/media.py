"""Media in chat messages, checked before vLLM sees them: what a client may make the server fetch or
decode.

vLLM's media connector fetches any http(s) URL a message names unless it is given an allow-list,
follows redirects, and decodes whatever bytes come back; a data: URL is decoded whole before any
size is known. For a server that anyone with an API key can reach, that is a request forgery and a
memory bomb. Here, per image part:

- `data:` URLs only up to `option.max_image_bytes` (counted from the base64 length, before decoding),
  whose header PIL reads as an image of at most `option.max_image_pixels` (checked before its pixels
  are decoded), and which then decode completely (a truncated file is a 400, not an engine error);
- `http(s)` URLs only from the hosts in `option.allowed_media_domains` (none by default: nothing is
  fetched for a client unless the operator says so); vLLM gets the same list and no redirects;
- nothing else: no local paths, no `file:` URLs, no precomputed embeddings;
- at most `option.limit_mm_per_prompt`'s image count per request (default `DEFAULT_MAX_IMAGES`).

Every refusal is a 400 that says which message and part, and why.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from lmi_server.api.errors import APIError
from lmi_server.media_policy import DEFAULT_MAX_IMAGES, MediaPolicy  # noqa: F401 - re-exported for api/

URL_PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "audio_url": "audio"}
"""Part types that carry a URL, and the modality each counts against."""

REFUSED_PARTS = {"image_embeds", "audio_embeds", "image_pil"}
"""Parts a client may not send: tensors or objects that bypass every check below."""


def check_messages(messages: Iterable[Any], policy: MediaPolicy) -> None:
    """Raise a 400 for the first media part the policy refuses; decode every data: image once."""
    counts: dict[str, int] = {}
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, Mapping):
                continue
            where = f"messages[{i}].content[{j}]"
            kind = _part_kind(part)
            if kind in REFUSED_PARTS:
                raise APIError(400, f"{where}: parts of type {kind!r} are not accepted; send the image as a data: URL")
            if kind not in URL_PARTS:
                continue
            modality = URL_PARTS[kind]
            counts[modality] = counts.get(modality, 0) + 1
            limit = policy.max_items.get(modality)
            if limit is not None and counts[modality] > limit:
                raise APIError(400, f"{where}: more than {limit} {modality} part(s) in one request "
                                    "(option.limit_mm_per_prompt)")
            url = _url_of(part, kind)
            if url is None:
                raise APIError(400, f"{where}: {kind} needs a URL string ({{\"url\": \"data:image/png;base64,...\"}})")
            check_url(url, policy, where, image=modality == "image")


def check_url(url: str, policy: MediaPolicy, where: str, *, image: bool) -> None:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        if image:
            check_data_image(url, policy, where)
        return
    if scheme in ("http", "https"):
        host = (urlsplit(url).hostname or "").lower()
        if not policy.allowed_domains:
            raise APIError(400, f"{where}: this server fetches no URLs for clients; send the image as a data: URL "
                                "(the operator may allow hosts with option.allowed_media_domains)")
        if host not in policy.allowed_domains:
            raise APIError(400, f"{where}: host {host[:100]!r} is not in option.allowed_media_domains")
        return
    raise APIError(400, f"{where}: only data: URLs (and http(s) from allowed hosts) are accepted, not "
                        f"{(scheme + ':') if scheme else 'a local path'}")


def check_data_image(url: str, policy: MediaPolicy, where: str) -> None:
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header.lower():
        raise APIError(400, f"{where}: a data: image URL must be base64 (data:image/png;base64,...)")
    approx_bytes = len(payload) * 3 // 4
    if approx_bytes > policy.max_image_bytes:
        raise APIError(400, f"{where}: the image is about {approx_bytes} bytes, more than option.max_image_bytes "
                            f"({policy.max_image_bytes})")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: the data: URL is not valid base64") from None
    check_image_bytes(raw, policy, where)


def check_image_bytes(raw: bytes, policy: MediaPolicy, where: str) -> None:
    """Size from the header first (a small file may declare billions of pixels), then a full decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as image:
            width, height = image.size
            if width * height > policy.max_image_pixels:
                raise APIError(400, f"{where}: the image is {width}x{height} pixels, more than option.max_image_pixels "
                                    f"({policy.max_image_pixels})")
            image.load()
    except APIError:
        raise
    except Image.DecompressionBombError:  # PIL's own ceiling, far above ours, hit before the header is ours
        raise APIError(400, f"{where}: the image declares more pixels than option.max_image_pixels "
                            f"({policy.max_image_pixels})") from None
    except UnidentifiedImageError:
        raise APIError(400, f"{where}: the data is not an image this server can decode") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise APIError(400, f"{where}: the image cannot be decoded ({str(exc)[:120]})") from None


def _part_kind(part: Mapping[str, Any]) -> str | None:
    kind = part.get("type")
    if isinstance(kind, str):
        return kind
    for key in (*REFUSED_PARTS, *URL_PARTS):  # vLLM infers the type from the key when none is given
        if key in part:
            return key
    return None


def _url_of(part: Mapping[str, Any], kind: str) -> str | None:
    value = part.get(kind, part.get("image_url"))  # OpenAI's input_image carries image_url
    if isinstance(value, Mapping):
        value = value.get("url")
    return value if isinstance(value, str) else None
