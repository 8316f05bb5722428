"""`vllm bench serve`, able to measure SageMaker's `/invocations` too.

vLLM's serving benchmark refuses a completions URL that does not end in `completions`; an
OpenAI completions body posted to `/invocations` is answered in the same stream format (by
lmi-server and by vLLM's own server alike), so the check lets `/invocations` through and stays
as it is for every other URL. Everything else is the unchanged tool:

    python benchmarks/bench_serve.py --base-url http://127.0.0.1:8080 --endpoint /invocations ...
"""

from __future__ import annotations

import sys


def main() -> None:
    from vllm.benchmarks.lib import endpoint_request_func
    from vllm.benchmarks.serve import add_cli_args, main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    check = endpoint_request_func._validate_api_url

    def validate(api_url: str, api_name: str, expected_suffixes) -> None:
        if api_url.rstrip("/").endswith("/invocations"):
            return
        check(api_url, api_name, expected_suffixes)

    endpoint_request_func._validate_api_url = validate
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_serve(parser.parse_args(sys.argv[1:]))


if __name__ == "__main__":
    main()
