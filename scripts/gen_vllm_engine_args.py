"""Regenerate lmi_server/config/vllm_engine_args.json from the installed vLLM.

The config module must validate vLLM engine arguments without importing vLLM (config checks
must not need an engine), so the names and simple types of `AsyncEngineArgs` are recorded here
once per pinned vLLM version. tests/unit/config/test_vllm_table.py checks the table is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "lmi_server" / "config" / "vllm_engine_args.json"


def main() -> int:
    from lmi_server.config.vllm_table_gen import describe_engine_args

    table = describe_engine_args()
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table['args'])} engine arguments for vLLM {table['vllm_version']} to {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
