"""Formatters of the `shouter` example adapter of the demo model.

One copy of them exists: the embedded assistant's shouter, which ships inside the package
(lmi_server/demo/assistant/adapters/shouter/model.py; found through the catalogue). This file runs
that one, so both shouters answer alike: LMI requests without max_new_tokens get 16, and the
generated text comes back upper-cased.
"""

import runpy

from lmi_server.catalogue import ASSISTANT

_SHOUTER = runpy.run_path(str(ASSISTANT.adapters_dir() / "shouter" / "model.py"))
short_answers = _SHOUTER["short_answers"]
shout = _SHOUTER["shout"]
