"""Each private vLLM/LMCache name the seam relies on (one row of `lmi_server.compat.USES`) still
exists in the INSTALLED packages with the parameters we pass, or, for an attribute an upstream
constructor assigns, that constructor still assigns it. A failure says what changed and which seam
function it breaks. `make upgrade-check VLLM=<version>` runs this file against another vLLM."""

from __future__ import annotations

import dataclasses

import pytest

from lmi_server.compat import CONTRACT, USES, contract

pytestmark = pytest.mark.unit


def test_every_row_is_complete_and_named_once():
    names = [use.name for use in CONTRACT]
    assert len(names) == len(set(names)), "a name appears twice in the seam's table"
    for use in CONTRACT:
        assert use.upstream in ("vllm", "lmcache") and use.kind in contract.KINDS, use
        # a private name is used through the seam's function; an internal entry point by its caller
        assert use.relies and use.why and use.used_by.startswith("compat." if use.private else "lmi_server."), use
    assert all(use.private for use in USES) and not any(use.private for use in CONTRACT[len(USES):])


@pytest.mark.parametrize("use", CONTRACT, ids=[use.name for use in CONTRACT])
def test_the_installed_upstream_still_has_it(use):
    changed = contract.check(use)
    assert changed is None, f"{changed}\n  we rely on: {use.relies}\n  why no supported hook: {use.why}"


# The check itself, against real upstream names given a wrong expectation: it must not always pass.

def _row(path: str) -> contract.Use:
    return next(use for use in USES if use.path == path)


def test_the_check_reports_a_name_that_disappeared():
    use = dataclasses.replace(_row("OpenAIServingResponses._extract_prompt_len"),
                              path="OpenAIServingResponses._extract_prompt_length")
    assert "no longer exists" in contract.check(use)


def test_the_check_reports_changed_parameters():
    use = dataclasses.replace(_row("create_request_queue"), params=("policy", "capacity"))
    changed = contract.check(use)
    assert "parameters changed from ('policy', 'capacity') to ('policy',)" in changed


def test_the_check_reports_an_attribute_no_longer_assigned():
    use = dataclasses.replace(_row("OpenAIServingResponses.response_store"),
                              path="OpenAIServingResponses.responses_kept")
    assert "no longer assigns self.responses_kept" in contract.check(use)


def test_the_check_reports_a_module_that_moved():
    use = dataclasses.replace(_row("get_mp_context"), module="vllm.v1.engine.launch_utils")
    assert "no longer imports" in contract.check(use)
