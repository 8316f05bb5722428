"""Log redaction masks credentials, never the figures of the start-up plan."""

from __future__ import annotations

import pytest

from lmi_server.redact import MASK, redact



@pytest.mark.parametrize(
    "line",
    [
        "KV per token: 2 (K,V) x 30 layers x 3 KV heads x 64 x 4 B = 46,080 B",
        "CPU tier 4.00 GiB / 46,080 B per token = 46,603 tokens",
        "max tokens=512, tokens: 3",
    ],
)
def test_plan_figures_are_left_alone(line):
    assert redact(line) == line


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("token=abc123XYZ", "abc123XYZ"),
        ('{"token": "12345678"}', "12345678"),  # quoted: a value, even when numeric
        ("api_key: sk-live-9f8e7d", "sk-live-9f8e7d"),
        ("password='hunter2'", "hunter2"),
        ("secret=12ab,34", "12ab"),
    ],
)
def test_credentials_are_masked(line, secret):
    out = redact(line)
    assert secret not in out and MASK in out
