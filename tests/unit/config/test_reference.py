"""The README documents every option key that exists."""

from pathlib import Path

from lmi_server.config.schema import LMI_ALIASES, NOT_APPLICABLE, own_keys

README = (Path(__file__).parents[3] / "README.md").read_text()


def test_readme_documents_every_own_key():
    missing = [k for k in own_keys() if f"option.{k}" not in README]
    assert not missing, f"README lacks: {missing}"


def test_readme_documents_lmi_aliases_and_compat_keys():
    missing = [k for k in list(LMI_ALIASES) + list(NOT_APPLICABLE) if f"option.{k}" not in README]
    assert not missing, f"README lacks: {missing}"


def test_readme_carries_the_generated_table_of_lmi_keys():
    from lmi_server.config.reference import lmi_keys_markdown

    assert lmi_keys_markdown() in README, "regenerate it: python -m lmi_server.config.reference"

