"""The new-tenant scheduler (lmi_server/tenant_scheduler.py) as vLLM's engine core drives it: a real
vLLM Scheduler over a KV cache of blocks, steps scheduled and answered with one sampled token per
scheduled request, as the model runner would."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from lmi_server.tenant_scheduler import TENANT_ARG, TenantPrefillScheduler, drained_adapter, fitting, lora_id, newcomers, tenant_of

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32",
    "vocab_size": 128, "intermediate_size": 128,
}
PROMPT = 20


def scheduler(tmp_path, *, max_num_seqs: int = 8, asynchronous: bool = False) -> TenantPrefillScheduler:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    model = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=1024, dtype="float32")
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, max_model_len=1024,
                            is_encoder_decoder=False)
    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache, device_config=DeviceConfig("cpu"))
    config.scheduler_config.async_scheduling = asynchronous
    cache.num_gpu_blocks = 200
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=200, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return TenantPrefillScheduler(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                                   log_stats=False, block_size=16)


def request(rid: str, tenant: str | None = None, lora: int | None = None, max_tokens: int = 50) -> Request:
    params = SamplingParams(max_tokens=max_tokens, extra_args={TENANT_ARG: tenant} if tenant else None)
    lora_request = LoRARequest(f"adapter-{lora}", lora, "/nowhere") if lora else None
    return Request(request_id=rid, prompt_token_ids=list(range(1, PROMPT + 1)), sampling_params=params,
                   pooling_params=None, lora_request=lora_request)


def step(s: TenantPrefillScheduler) -> dict[str, int]:
    """One engine step: what was scheduled (request id -> tokens), each answered with a token."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids],
        logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
    return dict(out.num_scheduled_tokens)


def flooded(tmp_path, **kwargs) -> TenantPrefillScheduler:
    """Three requests of tenant `flood` past their prefill, decoding."""
    s = scheduler(tmp_path, **kwargs)
    for i in range(3):
        s.add_request(request(f"f{i}", "flood"))
    assert step(s) == {"f0": PROMPT, "f1": PROMPT, "f2": PROMPT}
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1}
    return s


def test_a_new_tenants_first_prefill_runs_in_a_step_of_its_own(tmp_path):
    s = flooded(tmp_path)
    s.add_request(request("p", "probe"))
    s.add_request(request("f3", "flood"))  # the flood's refill, waiting behind the probe
    assert step(s) == {"p": PROMPT}  # the decodes and the refill wait one step
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1, "p": 1, "f3": PROMPT}
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1, "p": 1, "f3": 1}
    assert s.cleared_steps == 1


def test_a_tenant_already_running_mixes_its_prefill_with_the_decodes(tmp_path):
    s = flooded(tmp_path)
    s.add_request(request("f3", "flood"))
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1, "f3": PROMPT}
    assert s.cleared_steps == 0


def test_a_tenant_running_less_than_its_share_still_gets_the_step(tmp_path):
    """A probe sent while the previous probe still decodes beside a flood of three."""
    s = flooded(tmp_path)
    s.add_request(request("p1", "probe"))
    step(s)
    step(s)
    s.add_request(request("p2", "probe"))  # probe runs 1 of 4: under its share of 2
    assert step(s) == {"p2": PROMPT}
    assert s.cleared_steps == 2


def test_tenants_running_alike_clear_no_step_for_each_other(tmp_path):
    s = scheduler(tmp_path)
    for rid, tenant in (("a0", "alice"), ("a1", "alice"), ("b0", "bob"), ("b1", "bob")):
        s.add_request(request(rid, tenant))
    step(s)
    s.add_request(request("b2", "bob"))  # bob runs 2 of 4: its share, not under it
    assert step(s) == {"a0": 1, "a1": 1, "b0": 1, "b1": 1, "b2": PROMPT}
    assert s.cleared_steps == 0


def test_never_two_cleared_steps_in_a_row(tmp_path):
    s = flooded(tmp_path)
    s.add_request(request("a", "alice"))
    assert step(s) == {"a": PROMPT}
    s.add_request(request("b", "bob"))  # another new tenant at once: the decodes go first
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1, "a": 1, "b": PROMPT}
    assert s.cleared_steps == 1


def test_new_tenants_arriving_together_share_the_cleared_step_in_their_order(tmp_path):
    s = flooded(tmp_path)
    for rid, tenant in (("f3", "flood"), ("a", "alice"), ("f4", "flood"), ("b", "bob")):
        s.add_request(request(rid, tenant))
    assert step(s) == {"a": PROMPT, "b": PROMPT}
    assert [r.request_id for r in s.waiting] == ["f3", "f4"]  # the refills kept their order, in front
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1, "a": 1, "b": 1, "f3": PROMPT, "f4": PROMPT}


def test_without_a_free_slot_the_decodes_are_not_held(tmp_path):
    s = flooded(tmp_path, max_num_seqs=3)
    s.add_request(request("p", "probe"))
    assert step(s) == {"f0": 1, "f1": 1, "f2": 1}  # nothing the probe could use the step for
    assert s.cleared_steps == 0


def test_a_lone_tenant_is_scheduled_as_by_vllm(tmp_path):
    s = scheduler(tmp_path)
    s.add_request(request("a", "alice"))
    s.add_request(request("b", "bob"))  # nobody decodes yet: nothing to keep them from
    assert step(s) == {"a": PROMPT, "b": PROMPT}
    assert s.cleared_steps == 0


def test_adapters_name_the_tenant_when_admission_named_none(tmp_path):
    s = scheduler(tmp_path)
    s.add_request(request("x", lora=1))
    step(s)
    s.add_request(request("y", lora=1))
    s.add_request(request("z", lora=2))
    assert step(s) == {"z": PROMPT}  # adapter 2 had nothing running; adapter 1's refill waits
    assert tenant_of(request("q", lora=3)) == ("adapter", 3)
    assert tenant_of(request("q")) == ("adapter", 0)
    assert tenant_of(request("q", "alice", lora=3)) == ("tenant", "alice")  # admission's name wins


def test_asynchronous_scheduling_gets_the_same_rule_over_vllms_async_scheduler(tmp_path):
    s = scheduler(tmp_path, asynchronous=True)
    assert isinstance(s, AsyncScheduler) and isinstance(s, TenantPrefillScheduler)
    assert not isinstance(scheduler(tmp_path), AsyncScheduler)


@pytest.mark.parametrize(
    "waiting, expected",
    [
        ([SimpleNamespace(status=RequestStatus.WAITING, num_output_tokens=0, num_preemptions=0, sampling_params=None,
                          lora_request=None)], []),  # its tenant (the base model) is running
        ([SimpleNamespace(status=RequestStatus.WAITING, num_output_tokens=0, num_preemptions=1, sampling_params=None,
                          lora_request=SimpleNamespace(lora_int_id=5))], []),  # preempted: not a first prefill
        ([SimpleNamespace(status=RequestStatus.WAITING_FOR_REMOTE_KVS, num_output_tokens=0, num_preemptions=0,
                          sampling_params=None, lora_request=SimpleNamespace(lora_int_id=5))], []),  # not ready
        ([SimpleNamespace(status=RequestStatus.WAITING, num_output_tokens=0, num_preemptions=0, sampling_params=None,
                          lora_request=SimpleNamespace(lora_int_id=5))], [0]),
    ],
)
def test_only_ready_first_prefills_of_idle_tenants_are_newcomers(waiting, expected):
    running = [SimpleNamespace(is_prefill_chunk=False, sampling_params=None, lora_request=None)]
    assert newcomers(waiting, running) == [waiting[i] for i in expected]
    assert newcomers(waiting, [SimpleNamespace(is_prefill_chunk=True, sampling_params=None, lora_request=None)]) == []


def lora_scheduler(tmp_path, max_loras: int, **kwargs) -> TenantPrefillScheduler:
    from vllm.config import LoRAConfig

    s = scheduler(tmp_path, **kwargs)
    s.lora_config = LoRAConfig(max_loras=max_loras, max_lora_rank=8)
    return s


def run_to_end(s: TenantPrefillScheduler, max_loras: int, steps: int = 400) -> list[dict[str, int]]:
    """Steps until nothing is left, each checked for vLLM's LoRA invariant (its own assertion,
    in vLLM's schedule(), would kill the engine one step later)."""
    seen = []
    for _ in range(steps):
        if not s.running and not s.waiting:
            break
        loras = {lora_id(r) for r in s.running} - {0}
        assert len(loras) <= max_loras, f"running set holds adapters {sorted(loras)} over max_loras={max_loras}"
        seen.append(step(s))
    assert not s.running and not s.waiting
    return seen


def test_a_cleared_step_never_lets_more_adapters_run_than_max_loras(tmp_path):
    """The issue's flood: max_loras 1, two adapters busy. An adapter that does not fit beside the
    running ones gets no step of its own; vLLM admits it when the running adapter is done."""
    s = lora_scheduler(tmp_path, max_loras=1)
    for i in range(3):
        s.add_request(request(f"a{i}", lora=1, max_tokens=5))
    step(s)
    for i in range(3):
        s.add_request(request(f"b{i}", lora=2, max_tokens=5))
    steps = run_to_end(s, max_loras=1)
    assert s.cleared_steps == 0
    first_b = next(i for i, st in enumerate(steps) if "b0" in st)
    assert all(not any(r.startswith("a") for r in st) for st in steps[first_b:])  # after the a's, alone


def test_a_cleared_step_takes_the_newcomers_whose_adapters_fit(tmp_path):
    s = lora_scheduler(tmp_path, max_loras=2)
    for i in range(3):
        s.add_request(request(f"a{i}", lora=1, max_tokens=6))
    step(s)
    step(s)
    s.add_request(request("c", lora=3, max_tokens=6))
    s.add_request(request("b", lora=2, max_tokens=6))  # only one more adapter fits beside adapter 1
    s.add_request(request("base", max_tokens=6))  # the base model always fits
    assert step(s) == {"c": PROMPT, "base": PROMPT}
    assert s.cleared_steps == 1
    run_to_end(s, max_loras=2)


def test_fitting_counts_every_running_adapter():
    running = [SimpleNamespace(lora_request=LoRARequest("a", 1, "/x")), SimpleNamespace(lora_request=None)]
    due = [SimpleNamespace(lora_request=LoRARequest(n, i, "/x")) for n, i in (("b", 2), ("a", 1), ("c", 3))]
    assert [r.lora_request.lora_int_id for r in fitting(due, running, 2)] == [2, 1]
    assert fitting(due, running, None) == due


def test_a_newcomers_adapter_gets_a_slot_before_a_floods_refills(tmp_path):
    """max_loras 1, a flood on adapter 1 that keeps refilling: the newcomer on adapter 2 runs once
    the flood's running requests end, before its refills (which keep their order and run after)."""
    s = lora_scheduler(tmp_path, max_loras=1)
    for i in range(3):
        s.add_request(request(f"a{i}", lora=1, max_tokens=4))
    step(s)
    s.add_request(request("b", lora=2, max_tokens=4))
    for i in range(3, 6):
        s.add_request(request(f"a{i}", lora=1, max_tokens=4))
    steps = run_to_end(s, max_loras=1)
    first = {rid: next(i for i, st in enumerate(steps) if rid in st) for rid in ("b", "a3", "a4", "a5")}
    assert first["b"] < first["a3"] <= first["a4"] <= first["a5"]
    assert drained_adapter([request("x", lora=2)], list(s.running)) is None  # nothing running: nothing to drain


def test_the_drained_adapter_is_the_one_running_the_fewest():
    running = [SimpleNamespace(lora_request=LoRARequest(n, i, "/x")) for n, i in (("a", 1), ("a", 1), ("c", 3))]
    running.append(SimpleNamespace(lora_request=None))  # the base model holds no adapter slot
    blocked = [SimpleNamespace(lora_request=LoRARequest("b", 2, "/x"))]
    assert drained_adapter(blocked, running) == 3
    assert drained_adapter([SimpleNamespace(lora_request=None)], running) is None  # the base model is never blocked
