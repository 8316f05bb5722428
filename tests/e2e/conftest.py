"""Servers shared by the whole session (engine start-up is the cost), one per set of properties
that several modules need; a test that ends its server takes one over at the end of its life.

- `server` (also named `lora`): the demo model with the tool-calling options, LoRA on and the
  example adapters, a batch of eight (tests/e2e/test_api.py, test_lora.py, test_tools.py,
  test_adapter_tenants.py's flood, ...). Modules before
  test_lora.py name no existing adapter: it checks their fresh state.
  The concurrent fuzzer reuses it after everything else, then test_lifecycle.py's SIGTERM drain ends it.
- `busy_server`: the demo model with LoRA off, one sequence at a time and a queue of one
  (tests/e2e/test_load_shedding.py; the LoRA-off checks of test_adapter_naming.py and test_api.py),
  with LMCache's disk tier on a volume that holds an earlier run's leftovers and a
  password-protected Redis tier (vLLM's prefix cache off): the seed start of test_kv_restart.py
  (`kv_seed`, which ends it after them); test_scale_out.py's bf16 replicas then share that Redis.
- `assistant` (also named `assistant_with_lora`): the embedded assistant with an API key, LoRA on,
  vLLM's request logger and a greedy input formatter (test_assistant_kit.py, test_front_doors.py;
  its base model is the greedy reference of test_assistant_eagle.py, test_speculative.py and
  test_suffix_decoding.py).
- `assistant_eagle`: the embedded assistant with `option.speculative_method=eagle` and nothing else,
  the README's example (test_assistant_eagle.py, then test_speculative.py's greedy-only checks: a
  speculative CPU engine refuses sampling, lmi_server/engine_limits.py).
- `keyed_server`: the demo model behind a key file of plain keys and named tenants, LoRA, LMCache
  as `busy_server` has it (the same volume, with O_DIRECT, and Redis; vLLM's prefix cache off), KV
  loads that fail on demand, a batch of one with priority scheduling and a budget of one engine
  rebuild: test_kv_restart.py's restart (started there, right after the seed), then
  test_security.py, test_tenants.py, test_lmcache.py, and last test_lifecycle.py's rebuild and its
  death past the budget, which ends it.
- `lmi_dir`: an LMI user's model directory (formatters, handle, adapters fine-tuned from the hub
  id) with a 128-token context (test_lmi_dropin.py, then test_fuzz.py).
- `blend_server`: the demo model downloaded from S3 at start-up, with option.tgi_compat, LMCache's
  KV blending and vLLM's prefix cache on (test_blend.py, then test_s3_model.py).

Servers of their own (their properties conflict with every shared one): the EAGLE-3 assistant
(test_assistant_eagle.py; one speculative method per engine), the embeddings model,
`make serve` exactly as the README runs it, the vision model with LMCache beside vLLM's prefix cache
(test_vision.py: its LMCache check empties vLLM's prefix cache first, POST /reset_prefix_cache) and
the two scale-out replicas behind vllm-router (test_scale_out.py: bf16, with `kv_redis` as the
chart's external shared tier, where `kv_seed` left float32 chunks: the other dtype that never reads
them). test_lifecycle.py's corrupt-weights start starts a server process but no engine: the
weights' headers fail it first (lmi_server/weights_check.py). Also of their own: the
suffix-decoding assistant (test_suffix_decoding.py).

Engine starts in the whole suite, tests/e2e/test_containers.py apart: 14, the 7 shared servers
above and 7 of their own (count them with LMI_TEST_STARTS_LOG=FILE, tests/support/server.py: its
lines hold the corrupt-weights start too, not the scale-out replicas, which deploy/cluster.py starts)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.prestart import prestartable
from tests.support.s3 import moto_s3  # noqa: F401 - a fixture (blend_server)
from tests.support.server import DEMO_PROPS, REPO, ServerProcess, running_server, server_env, write_properties

BASE_PROPS = {
    **DEMO_PROPS,  # the tiny trained demo model: fast starts for tests
    # vLLM's tool-calling front-end options as option.* keys (tests/e2e/test_tools.py). The pythonic
    # parser lets vLLM force a named/required call's JSON with structured output (vLLM 0.32's hermes
    # parser leaves that to the model); compact JSON keeps a tiny model from looping on whitespace.
    "option.enable_auto_tool_choice": "true",
    "option.tool_call_parser": "pythonic",
    "option.structured_outputs_config": '{"backend": "xgrammar", "disable_any_whitespace": true}',
}
ASSISTANT_KEY = "front-doors-key-0123456"
# Greedy decoding for every OpenAI/Anthropic-shaped body (an LMI input formatter in the assistant's
# model directory): Claude Code samples at temperature 1, and a 135M model then rambles.
GREEDY_FORMATTER = '''from djl_python.input_parser import input_formatter


@input_formatter
def greedy(payload, **kwargs):
    """Greedy decoding for every OpenAI/Anthropic-shaped body: answers the tests can check."""
    if isinstance(payload, dict) and "inputs" not in payload:
        payload["temperature"] = 0
    return payload
'''
LORA_PROPS = {"option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8"}
LAST_MODULES = ("test_concurrent_fuzz.py",)
# First of all e2e modules, before any session server is up: a two-node group and its one-node
# reference hold three engines at once (in the suite's order they once met a dozen session servers
# still up and the host ran out of memory).
FIRST_MODULES = ("test_multinode.py",)
# Tests (by module or by name) that run right after the module named (after its own followers,
# when it is one itself): they end its shared server (tests/e2e/test_lifecycle.py: one engine
# rebuild, then a death past the budget), change what that module expects fresh
# (tests/e2e/test_fuzz.py), or are its server's other users.
FOLLOWS = {
    "test_fuzz.py": "test_lmi_dropin.py",
    # the second module of a shared server at once: it does not idle beside the modules between
    "test_front_doors.py": "test_assistant_kit.py",
    "test_suffix_decoding.py": "test_assistant_kit.py",  # its reference is the same assistant
    # the restart of test_kv_restart.py (which follows test_load_shedding.py), then its own modules,
    # test_lmcache.py after them, and the two engine deaths that end it last of all
    "test_security.py": "test_load_shedding.py",
    "test_tenants.py": "test_load_shedding.py",
    "test_lmcache.py": "test_tenants.py",
    "test_a_dead_engine_is_rebuilt_in_the_same_process_keeping_sessions_adapters_and_the_cache_server": "test_lmcache.py",
    "test_engine_death_past_the_restart_budget_fails_in_flight_requests_and_exits_non_zero": "test_lmcache.py",
    "test_s3_model.py": "test_blend.py",
    "test_adapter_tenants.py": "test_lora.py",  # it loads adapters whose fresh state test_lora.py checks
    "test_speculative.py": "test_assistant_eagle.py",  # the same EAGLE assistant
    "test_kv_restart.py": "test_load_shedding.py",  # it seeds its volume with busy_server, then ends it
}
LAST_TEST = "test_sigterm_drains_open_streams_then_exits_0_and_leaves_no_process"  # on `server`
SHARED_SERVERS = ("server", "busy_server", "assistant", "assistant_eagle", "keyed_server", "lmi_dir", "blend_server")


def pytest_collection_modifyitems(config, items):
    """Tests that take over a shared server right after the module named in FOLLOWS (a follower
    of a follower after that one's place), the fuzzer after everything else (it loads adapters and
    fills caches that other modules expect fresh, and it reuses their session servers), the drain
    last (it ends the demo server)."""
    here = Path(__file__).parent
    last_of = {item.path.name: i for i, item in enumerate(items) if item.path.parent == here}

    def place(i, item, seen=()):
        """Its own index; a follower's: the place of the followed module's last test, then its own."""
        if item.path.parent != here:  # a unit test module of the same name
            return (i,)
        follows = FOLLOWS.get(item.originalname) or FOLLOWS.get(item.path.name)
        if follows not in last_of or follows in seen:
            return (i,)
        j = last_of[follows]
        return (*place(j, items[j], (*seen, follows)), 1 + i)

    def key(pair):
        i, item = pair
        if item.originalname == LAST_TEST:
            return (2, i)
        if item.path.name in LAST_MODULES:
            return (1, i)
        if item.path.name in FIRST_MODULES and item.path.parent == here:
            return (-1, i)
        return (0, *place(i, item))

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
    # `kv_seed` stops busy_server: its users (test_kv_restart.py, which follows
    # test_load_shedding.py, and test_scale_out.py, after both by name) come after busy_server's others.
    seed = next((item for item in items if "kv_seed" in item.fixturenames), None)
    late = [item for item in items[items.index(seed) + 1:] if "busy_server" in item.fixturenames
            and "kv_seed" not in item.fixturenames] if seed else []
    if late:
        raise pytest.UsageError(f"{late[0].nodeid} needs busy_server after {seed.nodeid} seeds its volume and Redis "
                                "(kv_seed), which stops it: order it before (FOLLOWS)")


def pytest_runtest_teardown(item, nextitem):
    """Stop a session server once no test left in the run asks for it (its fixture's teardown at
    the session's end then finds it stopped): fewer idle engines side by side."""
    later = item.session.items[item.session.items.index(item) + 1:]
    for name in SHARED_SERVERS:
        proc = (getattr(item, "funcargs", None) or {}).get(name)
        if proc is not None and not any(name in other.fixturenames for other in later):
            proc.stop()


@pytest.fixture(scope="session")
@prestartable
def server(tmp_path_factory):
    """The demo model with the tool-calling options and LoRA on, with its example adapters plus: a
    third copy (three adapters compete for max_loras=2), one whose script fails to import (424)
    and one whose formatter raises on every request."""
    from lmi_server.demo.builder import ensure_demo_model

    model_dir = tmp_path_factory.mktemp("model-dir")
    root = model_dir / "my-adapters"
    root.mkdir()
    _adapters_for(ensure_demo_model(), root)
    shutil.copytree(root / "hello-printer", root / "hello-copy")
    shutil.copytree(root / "hello-printer", root / "broken-script")
    (root / "broken-script" / "model.py").write_text("import no_such_module_for_lora_tests\n")
    shutil.copytree(root / "hello-printer", root / "raising")
    (root / "raising" / "model.py").write_text(
        "from djl_python.output_formatter import output_formatter\n"
        "@output_formatter\ndef refuse(response):\n    raise ValueError('formatter refused ' + repr(str(response)[:5]))\n"
    )
    # the drain test (tests/e2e/test_lifecycle.py, last) needs a drain that outlasts its long streams
    # a batch of eight (plus fair admission's two reserved slots): small enough for a flood of one
    # adapter to queue (tests/e2e/test_adapter_tenants.py), as many as the concurrent fuzzer sends
    props = {**BASE_PROPS, **LORA_PROPS, "option.adapters_path": str(root), "option.graceful_shutdown_timeout": "300",
             "option.max_num_seqs": "8"}
    with running_server(model_dir, props, adapter_root=root, shm_before=set(os.listdir("/dev/shm"))) as proc:
        yield proc


@pytest.fixture(scope="session")
def lora(server):
    """The shared server, named for what LoRA tests need of it."""
    return server


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def kv_redis(tmp_path_factory):
    """The Redis tier of `busy_server` and `keyed_server` (tests/e2e/test_kv_restart.py's seed and
    restart), then the external shared tier of tests/e2e/test_scale_out.py's replicas, with
    REDIS_PASSWORD from a 0600 config file: its port, or None without redis-server
    (test_kv_restart.py, test_security.py and test_scale_out.py are then skipped)."""
    from deploy.cluster import redis_server_binary
    from tests.support.kv_volume import password_redis

    if redis_server_binary() is None:
        yield None
        return
    with password_redis(tmp_path_factory.mktemp("kv-redis"), REDIS_PASSWORD) as port:
        yield port


@pytest.fixture(scope="session")
def kv_volume(tmp_path_factory):
    """The disk tier of `busy_server` and `keyed_server`: a volume with an earlier run's leftovers
    (tests/support/kv_volume.py)."""
    from tests.support.kv_volume import leftover_volume

    return leftover_volume(tmp_path_factory.mktemp("kv-volume"))


@pytest.fixture(scope="session")
@prestartable
def busy_server(tmp_path_factory, kv_volume, kv_redis):
    """LoRA off, one sequence at a time (option.max_rolling_batch_size=1), one request may wait
    (option.job_queue_size=1) for at most 30 s (option.max_queue_wait=30): the load-shedding
    premise (tests/e2e/test_load_shedding.py); other modules send it one request at a time.
    LMCache's CPU and disk tiers, the disk on `kv_volume` (what it held once ready:
    `kv_start_state`), and `kv_redis`, vLLM's prefix cache off: tests/e2e/test_kv_restart.py seeds
    them with it last (`kv_seed`, which stops it), then restarts on them as `keyed_server`."""
    from lmi_server.kvcache.disk_budget import chunk_files
    from tests.support.kv_volume import lmcache_yaml

    model_dir = tmp_path_factory.mktemp("shedding")
    (model_dir / "lmcache.yaml").write_text(lmcache_yaml(kv_volume, kv_redis, REDIS_PASSWORD))
    props = {**BASE_PROPS, "option.max_rolling_batch_size": "1", "option.job_queue_size": "1",
             "option.max_queue_wait": "30", "option.max_model_len": "16384",
             "option.enable_prefix_caching": "false", "option.lmcache_config_file": "lmcache.yaml"}
    with running_server(model_dir, props, properties=props, kv_volume=kv_volume) as proc:
        files = chunk_files(kv_volume)
        proc.kv_start_state = (len(files), sum(size for _, size, _ in files))
        yield proc


@pytest.fixture(scope="session")
def kv_seed(busy_server, kv_volume, kv_redis):
    """`busy_server`'s last requests: documents A, then B (tests/support/kv_volume.py), their
    float32 chunks stored on `kv_volume` and in `kv_redis`; then it is stopped. The chunk files of
    each, the answers, what the volume held when it was ready, when it stopped: what
    tests/e2e/test_kv_restart.py restarts on, and what the bf16 replicas of
    tests/e2e/test_scale_out.py find in that Redis (every other user of `busy_server` runs first:
    pytest_collection_modifyitems checks it)."""
    import time

    from tests.support.kv_volume import DOC_A, DOC_B, complete, real_chunks, wait_stored

    try:
        before = real_chunks(kv_volume)  # what the other modules' requests stored
        a = complete(busy_server, DOC_A)
        files_a = wait_stored(kv_volume, kv_redis, REDIS_PASSWORD, before)
        b = complete(busy_server, DOC_B)
        files_b = wait_stored(kv_volume, kv_redis, REDIS_PASSWORD, before | files_a)
        warm = complete(busy_server, DOC_A)
    finally:
        busy_server.stop()
    return {"a": a, "b": b, "warm_a": warm, "files_a": files_a, "files_b": files_b,
            "start_state": busy_server.kv_start_state, "stopped": time.time()}


def _adapters_for(base: Path, root: Path) -> None:
    """Copy the committed example adapters when they were trained on this base, else retrain."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from train_adapters import fingerprint
    finally:
        sys.path.pop(0)
    fp = fingerprint(base)
    src = REPO / "adapters"
    fits = all(
        (src / n / "training.json").is_file() and json.loads((src / n / "training.json").read_text())["base_fingerprint"] == fp
        for n in ("hello-printer", "shouter")
    )
    if fits:
        for n in ("hello-printer", "shouter"):
            shutil.copytree(src / n, root / n)
    else:
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "train_adapters.py"), "--base", str(base), "--out", str(root)],
            check=True, cwd=REPO, timeout=1800,
        )


@pytest.fixture(scope="session")
@prestartable
def assistant(tmp_path_factory):
    """The embedded assistant (the default model) with an API key, LoRA on (its example adapters,
    tests/e2e/test_assistant_kit.py), vLLM's request logger (tests/e2e/test_front_doors.py checks
    what the CLIs print against it) and a model.py that pins greedy decoding for OpenAI/Anthropic
    bodies; its base model, asked without an adapter, is the greedy reference without speculation
    of tests/e2e/test_assistant_eagle.py."""
    model_dir = tmp_path_factory.mktemp("assistant")
    (model_dir / "model.py").write_text(GREEDY_FORMATTER)
    props = {
        "option.cpu_kv_cache_space": "1", "option.api_key": ASSISTANT_KEY,
        "option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8",
        "option.enable_log_requests": "true", "option.enable_log_outputs": "true", "option.enable_log_deltas": "false",
    }
    with running_server(model_dir, props) as proc:
        yield proc


@pytest.fixture(scope="session")
def assistant_with_lora(assistant):
    """The shared assistant, named for what the example-adapter tests need of it."""
    return assistant


@pytest.fixture(scope="session")
@prestartable
def assistant_eagle(tmp_path_factory):
    """The README's speculative-decoding example: `option.speculative_method=eagle` and nothing else
    on the embedded assistant, whose shipped EAGLE-1 head it finds by itself
    (tests/e2e/test_assistant_eagle.py, then tests/e2e/test_speculative.py). No API key, LoRA off."""
    props = {"option.speculative_method": "eagle", "option.cpu_kv_cache_space": "1"}
    with running_server(tmp_path_factory.mktemp("assistant-eagle"), props) as proc:
        yield proc


# Run inside `keyed_server`'s engine processes: while the file named by LMI_TEST_FAIL_KV_LOADS
# exists, the worker's copy of every LMCache hit into its KV cache raises, as when the cache server
# dies between the lookup and the load (tests/e2e/test_lmcache.py switches it on for one test).
FAILING_LOADS = """\
def on_connector_import():
    import os

    from lmcache.v1.multiprocess.transfer_context import worker_transfer

    original = worker_transfer.scatter_cpu_to_paged_kv

    def scatter_cpu_to_paged_kv(*args, **kwargs):
        if os.path.exists(os.environ["LMI_TEST_FAIL_KV_LOADS"]):
            raise RuntimeError("injected KV load failure")
        return original(*args, **kwargs)

    worker_transfer.scatter_cpu_to_paged_kv = scatter_cpu_to_paged_kv
"""


SECURITY_KEYS = ["sk-first-" + secrets.token_hex(12), "sk-second-" + secrets.token_hex(12)]
TENANT_KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789", "limited": "limited-key-0123456789"}
REDIS_PASSWORD = "redis-pw-" + secrets.token_hex(12)
# Raises from its 6th streamed piece on (per request): the stream has begun when it fails.
RAISE_LATE = """
import json

from djl_python.output_formatter import output_formatter

_seen = {}


@output_formatter
def raise_late(response):
    if not isinstance(response, str):  # a whole response: not streamed
        return response
    data = response[len("data:"):].strip()
    if data == "[DONE]":
        return response
    key = json.loads(data).get("id")  # the request's id: pieces counted per stream
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] > 5:
        raise RuntimeError("formatter gave up at piece %d" % _seen[key])
    return response
"""


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory, kv_volume, kv_redis):
    """API keys only, from a key file: two unnamed keys (rotation, tests/e2e/test_security.py) and
    three named tenants (tests/e2e/test_tenants.py). For security: LoRA with the example adapters
    (`adapters_root`), a copy and one whose formatter fails mid-stream; LMCache as `busy_server` has
    it (CPU tier, the disk tier on `kv_volume` with O_DIRECT (`disk`), `kv_redis` with its password
    from a 0600 config file, never on a command line), vLLM's prefix cache off: it is the restart of
    tests/e2e/test_kv_restart.py, which runs first (`kv_start` is when it was started). For tenants:
    a batch of one (plus option.reserved_slots) with vLLM's priority scheduling, a queue of ten,
    half of it per tenant, and a context long enough for a holding request of 15,000 tokens. For
    tests/e2e/test_lmcache.py, after them: KV loads that fail on demand (`fail_loads`, a file whose
    existence switches the failure on, FAILING_LOADS). Last, a restart budget of one rebuild
    (option.engine_max_restarts=1): the engine-death tests of tests/e2e/test_lifecycle.py (one
    rebuild, then a death past the budget that ends the process)."""
    import time

    from lmi_server.demo.builder import ensure_demo_model
    from tests.support import worker_hook
    from tests.support.kv_volume import lmcache_yaml

    model_dir = tmp_path_factory.mktemp("keyed-model-dir")
    root = model_dir / "adapters"
    root.mkdir()
    _adapters_for(ensure_demo_model(), root)
    shutil.copytree(root / "hello-printer", root / "hello-copy")
    shutil.copytree(root / "hello-printer", root / "raising-late")
    (root / "raising-late" / "model.py").write_text(RAISE_LATE)
    # else (no redis-server) test_security.py and test_kv_restart.py are skipped; test_tenants.py needs no Redis
    (model_dir / "lmcache.yaml").write_text(lmcache_yaml(kv_volume, kv_redis, REDIS_PASSWORD))
    (model_dir / "api_keys").write_text(
        "# rotation: both keys work\n" + "\n".join(SECURITY_KEYS) + "\n"
        f"name=alice key={TENANT_KEYS['alice']}\nname=bob key={TENANT_KEYS['bob']} weight=2\n"
        f"name=limited key={TENANT_KEYS['limited']} requests_per_second=0.05\n"
    )
    props = {
        **BASE_PROPS, **LORA_PROPS, "option.adapters_path": str(root), "option.api_key_file": "api_keys",
        "option.enable_prefix_caching": "false",  # cached_tokens then counts LMCache hits only
        "option.lmcache_config_file": "lmcache.yaml",
        "option.max_rolling_batch_size": "1", "option.job_queue_size": "10", "option.tenant_queue_share": "0.5",
        "option.scheduling_policy": "priority",
        # the holding request must outlast the tenants' tests on a fast, quiet host (3,500 tokens did not)
        "option.max_model_len": "16384",
        "option.engine_max_restarts": "1",
    }
    fail_loads = model_dir / "fail-kv-loads"
    env = {"PYTHONPATH": worker_hook.install(tmp_path_factory.mktemp("failing-loads"), FAILING_LOADS),
           "LMI_TEST_FAIL_KV_LOADS": str(fail_loads)}
    with running_server(model_dir, props, env=env, redis_port=kv_redis, adapters_root=root, disk=kv_volume,
                        fail_loads=fail_loads, kv_start=time.time()) as proc:
        try:
            yield proc
        finally:  # (test_lifecycle.py's death test ends it first) nothing of its engine may be left
            children = proc.descendants()
            proc.stop()
            leftovers = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
            assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture(scope="session")
@prestartable
def lmi_dir(tmp_path_factory):
    """An LMI user's model directory, unchanged (tests/support/lmi_model_dir.py: model-level
    formatters and handle, adapters fine-tuned from the hub id), LoRA on; with a short context
    (option.max_model_len=128: a generated request asking for many tokens ends quickly) and a batch
    of 16 for the fuzzer (tests/e2e/test_fuzz.py, right after tests/e2e/test_lmi_dropin.py)."""
    from lmi_server.demo.builder import ensure_demo_model
    from tests.support.lmi_model_dir import write_lmi_model_dir

    model_dir = tmp_path_factory.mktemp("lmi-model-dir")
    write_lmi_model_dir(model_dir, _adapters_for, ensure_demo_model())
    props = {**BASE_PROPS, **LORA_PROPS, "option.max_model_len": "128", "option.max_rolling_batch_size": "16"}
    with running_server(model_dir, props) as proc:
        yield proc


S3_MODEL_URL = "s3://models/lmi-demo"  # its last component is the served name, as the test's clients use it


@pytest.fixture(scope="session")
@prestartable
def blend_server(tmp_path_factory, moto_s3):
    """The demo model as a TGI client's deployment finds it in S3: uploaded to a real S3-protocol
    server on loopback and downloaded at start-up (option.model_id=s3://models/lmi-demo, the
    standard AWS variables in the server's environment), option.tgi_compat=true
    (tests/e2e/test_s3_model.py); with LMCache's KV blending beside vLLM's prefix cache
    (option.lmcache_blend=true, tests/e2e/test_blend.py). The S3 facts the test checks are set on
    it: `s3_url`, `s3_keys` (uploaded), `s3_source` (the directory uploaded), `s3_env`."""
    from lmi_server.demo.builder import ensure_demo_model
    from tests.support.s3 import s3_environment, upload_dir

    work = tmp_path_factory.mktemp("s3-blend")
    source = ensure_demo_model(work / "demo-src")  # the project's own tiny model, as lmi-demo resolves it
    keys = upload_dir(moto_s3, "models", "lmi-demo", source, multipart_bytes=8 * 2**20)
    model_dir = work / "model-dir"
    model_dir.mkdir()
    (model_dir / "lmcache.yaml").write_text("chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n")
    props = {**BASE_PROPS, "option.model_id": S3_MODEL_URL, "option.tgi_compat": "true",
             "option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true"}
    write_properties(model_dir, props)
    env = s3_environment(moto_s3, work / "cache")  # as from a container's environment
    proc = ServerProcess(model_dir, model_dir / "server.log", env={**server_env(), **env}).start()
    proc.s3_url, proc.s3_keys, proc.s3_source, proc.s3_env = S3_MODEL_URL, keys, source, env
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
