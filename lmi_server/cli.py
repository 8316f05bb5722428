"""`lmi-server serve | config | demo-model | default-model | options` (thin: parsing and dispatch only)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from lmi_server.config.schema import ConfigError
from lmi_server.host_requirements import HOST_REQUIREMENT_EXIT_CODE, HostRequirementError

log = logging.getLogger("lmi_server")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", help="model directory (default: /opt/ml/model, or $LMI_MODEL_DIR)")
    p.add_argument("--properties", help="serving.properties file (default: MODEL_DIR/serving.properties)")


def _load(args):
    from lmi_server.config.loader import load_serving_config

    return load_serving_config(args.model_dir, args.properties)


def cmd_config(args) -> int:
    from lmi_server.runtime import resolve_runtime

    cfg = _load(args)
    runtime = resolve_runtime(cfg, build_demo=False)
    from lmi_server.redact import redact

    print(redact(json.dumps(runtime.describe(), indent=2, default=str)))
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from lmi_server.api.app import create_app
    from lmi_server.api.lifecycle import DrainingServer, exit_after_serving
    from lmi_server.api.auth import load_api_keys, warn_if_unprotected
    from lmi_server.host_requirements import check_host
    from lmi_server.runtime import resolve_runtime
    from lmi_server import sagemaker_caches

    sagemaker_caches.apply()  # before anything reads HF_HOME and friends (Hugging Face reads it at import)
    cfg = _load(args)
    warn_if_unprotected(args.host, load_api_keys(cfg.security, cfg.model_dir))
    runtime = resolve_runtime(cfg, build_demo=True)
    rings = check_host(runtime.engine_args)
    runtime.apply_environment()
    if rings is not None:
        os.environ.update(rings.environment())
        (log.warning if rings.shrunk else log.info)("%s", rings.describe())
    runtime.log_start_up(log)
    if cfg.group is not None and cfg.group.role == "worker":
        from lmi_server.group.worker import run_worker

        return run_worker(cfg, runtime, args.host, args.port)
    if cfg.group is not None:
        from lmi_server.group.leader import watch_group

        watch_group(cfg.group, float(cfg.server.model_loading_timeout))
    if runtime.engine_memory:
        log.info(
            "engine KV cache %.2f GiB, chosen from this host: %s",
            runtime.engine_memory["kv_cache_gib"], "; ".join(runtime.engine_memory["reasons"]),
        )
    app = create_app(cfg, runtime.engine_args, runtime=runtime)
    drain_s = args.graceful_timeout if args.graceful_timeout is not None else cfg.server.graceful_shutdown_timeout
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        timeout_graceful_shutdown=max(1, int(drain_s)), timeout_keep_alive=30,
    )
    server = DrainingServer(config, app, drain_timeout_s=drain_s)
    app.state.uvicorn_server = server
    server.run()
    exit_after_serving(app)
    return 0  # not reached


def cmd_demo_model(args) -> int:
    from lmi_server.demo.builder import build_demo_model, ensure_demo_model

    path = build_demo_model(Path(args.dir)) if args.dir else ensure_demo_model()
    print(path)
    return 0


def cmd_default_model(args) -> int:
    from lmi_server.demo.assistant import AssistantUnavailable, ensure_assistant

    try:
        print(ensure_assistant())
    except AssistantUnavailable as exc:
        print(f"lmi-server: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_options(args) -> int:
    from lmi_server.config.reference import options_markdown

    print(options_markdown())
    return 0


def default_port() -> int:
    """SageMaker names the port in SAGEMAKER_BIND_TO_PORT (multi-container endpoints); 8080 otherwise."""
    import os

    value = os.environ.get("SAGEMAKER_BIND_TO_PORT", "").strip()
    if not value:
        return 8080
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SystemExit(f"lmi-server: SAGEMAKER_BIND_TO_PORT={value!r} is not a port number")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmi-server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the configured model (or the embedded demo model)")
    _add_config_args(serve)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=default_port(), help="default: $SAGEMAKER_BIND_TO_PORT, else 8080")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--graceful-timeout", type=float, default=None, help="seconds in-flight requests get on SIGTERM (default: option.graceful_shutdown_timeout)")
    serve.set_defaults(func=cmd_serve)

    config = sub.add_parser("config", help="print the resolved configuration and vLLM engine arguments")
    _add_config_args(config)
    config.set_defaults(func=cmd_config)

    demo = sub.add_parser("demo-model", help="build the embedded demo model (into DIR, or the cache)")
    demo.add_argument("dir", nargs="?")
    demo.set_defaults(func=cmd_demo_model)

    default = sub.add_parser("default-model", help="convert the embedded assistant into the cache (done by make setup)")
    default.set_defaults(func=cmd_default_model)

    options = sub.add_parser("options", help="print every option.* key as a Markdown table")
    options.set_defaults(func=cmd_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lmi_server.redact import install_log_redaction

    install_log_redaction()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"lmi-server: {exc}", file=sys.stderr)
        return 2
    except HostRequirementError as exc:
        print(f"lmi-server: cannot start: {exc}", file=sys.stderr)
        return HOST_REQUIREMENT_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
