"""The configuration reference page (docs site, generated from the config model) documents every
option key that exists, with its type, default and LMI names, and carries the table of LMI's keys."""

from __future__ import annotations

import re

import pytest

from lmi_server.config.engine_values import vllm_engine_arg_table, vllm_frontend_arg_table, vllm_frontend_excluded
from lmi_server.config.lmi_compat import keys_of
from lmi_server.config.options import SECTIONS
from lmi_server.config.reference import lmi_keys_markdown
from lmi_server.config.reference_page import reference_page
from lmi_server.config.schema import LMI_ALIASES, NOT_APPLICABLE, own_keys

PAGE = reference_page()


def row(key: str) -> list[str]:
    """The cells of the table row of `option.<key>` (the first such row)."""
    for line in PAGE.splitlines():
        if line.startswith(f"| `option.{key}` |"):
            return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    raise AssertionError(f"no row for option.{key}")


def test_the_page_documents_every_own_key_with_its_type_default_and_description():
    for name, (section, info) in own_keys().items():
        cells = row(name)
        default = "none" if info.default is None else f"`{info.default}`"
        assert cells[2] == default, (name, cells)
        assert (info.description or "").replace("|", "\\|") in cells[4], name
        assert cells[1], name


def test_the_page_documents_every_vllm_engine_argument_and_front_end_option():
    keys = [k for k in vllm_engine_arg_table() if k != "model"] + list(vllm_frontend_arg_table())
    missing = [k for k in keys if f"| `option.{k}` |" not in PAGE]
    assert not missing, f"reference lacks: {missing}"
    assert all(f"`{k}`" in PAGE for k in vllm_frontend_excluded())


def test_the_page_documents_lmi_aliases_and_compat_keys():
    """In LMI's spelling (`option.entryPoint`); keys are matched lower-cased."""
    missing = [k for k in list(LMI_ALIASES) + list(NOT_APPLICABLE) if f"`option.{k}`" not in PAGE.lower()]
    assert not missing, f"reference lacks: {missing}"


def test_the_page_carries_the_generated_table_of_lmi_keys():
    assert lmi_keys_markdown() in PAGE


@pytest.mark.parametrize(("key", "names"), [
    ("max_num_seqs", ["`option.max_rolling_batch_size`", "`MAX_BATCH_SIZE`"]),
    ("tensor_parallel_size", ["`option.tensor_parallel_degree`", "`TENSOR_PARALLEL_DEGREE`", "`SM_NUM_GPUS`"]),
    ("job_queue_size", ["`job_queue_size`", "`SERVING_JOB_QUEUE_SIZE`", "`MAX_CONCURRENT_REQUESTS`"]),
    ("max_request_bytes", ["`SAGEMAKER_MAX_PAYLOAD_IN_MB`", "`max_request_size`"]),
    ("model_id", ["`HF_MODEL_ID`"]),
])
def test_the_lmi_name_column_follows_aliases_variables_and_top_level_keys(key, names):
    cells = row(key)
    assert all(n in cells[3] for n in names), cells


def test_every_lmi_option_that_maps_to_a_key_names_a_row_of_the_page():
    """An LMI option mapped onto a key of ours or of vLLM's lands on a row that exists."""
    for name, entry in keys_of("option").items():
        if entry.alias:
            assert f"`option.{name}`" in row(entry.alias)[3], name


def test_sections_are_headed_by_name():
    assert all(f"### {section}" in PAGE for section in SECTIONS)
