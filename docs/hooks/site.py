"""mkdocs hook: the pages and files the site is built from beside docs/'s own.

- `reference.md`, the configuration reference, generated from the config model at every build
  (`lmi_server/config/reference_page.py`), so it cannot drift from the code;
- the benchmark figures, `benchmarks/results/*.png`, served from where the benchmarks write them,
  so a page links `benchmarks/results/NAME.png` and a missing figure fails the strict build; the
  benchmarks page ends with a list of every figure there, so that each one is reachable.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this tree's code, whichever checkout the environment was installed from
    sys.path.insert(0, str(ROOT))

from lmi_server.config.reference_page import PAGE_PATH, reference_page  # noqa: E402

FIGURES = "benchmarks/results"


def _figures() -> list[str]:
    return sorted(png.name for png in (ROOT / FIGURES).glob("*.png"))


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, PAGE_PATH, content=reference_page()))
    for name in _figures():
        files.append(File(f"{FIGURES}/{name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "benchmarks.md":
        return markdown
    listing = "\n".join(f"- [{name[:-4]}]({FIGURES}/{name})" for name in _figures())
    intro = f"Every figure in `{FIGURES}/`, by name (its JSON is beside it):"
    return f"{markdown.rstrip()}\n\n## Every figure\n\n{intro}\n\n{listing}\n"
