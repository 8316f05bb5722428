"""The CPU LoRA kernels: the same products as vLLM's for tokens with an adapter, nothing for tokens
without one (index -1, which vLLM's torch ops read as the last adapter slot)."""

from __future__ import annotations

import torch
from vllm.lora.ops import torch_ops

from lmi_server import lora_cpu

KERNELS = lora_cpu.kernels({name: getattr(torch_ops, name) for name in lora_cpu.NAMES})
SLOTS, RANK, IN, OUT = 3, 4, 16, 12


def _data(indices: list[int]):
    torch.manual_seed(0)
    x = torch.randn(len(indices), IN)
    a = torch.randn(SLOTS, 1, RANK, IN)
    b = torch.randn(SLOTS, 1, OUT, RANK)
    return x, a, b, torch.tensor(indices)


def test_tokens_with_adapters_get_vllms_products():
    x, a, b, idx = _data([0, 0, 2, 2, 2, 1, 0])
    for name, args in (("bgmv_shrink", (x, a)), ):
        ours, theirs = torch.zeros(len(idx), RANK), torch.zeros(len(idx), RANK)
        KERNELS[name](*args, ours, idx, 0.5)
        getattr(torch_ops, name)(*args, theirs, idx, 0.5)
        assert torch.allclose(ours, theirs, atol=1e-5)
    h = torch.randn(len(idx), RANK)
    ours, theirs = torch.ones(len(idx), OUT), torch.ones(len(idx), OUT)
    KERNELS["bgmv_expand"](h, b, ours, idx, True)
    torch_ops.bgmv_expand(h, b, theirs, idx, True)
    assert torch.allclose(ours, theirs, atol=1e-5)
    ours, theirs = torch.ones(len(idx), OUT * 2), torch.ones(len(idx), OUT * 2)
    KERNELS["bgmv_expand_slice"](h, b, ours, idx, OUT, OUT, True)
    torch_ops.bgmv_expand_slice(h, b, theirs, idx, OUT, OUT, True)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_prefill_runs_get_vllms_products():
    x, a, b, _ = _data([0] * 7)
    lengths, slots = torch.tensor([3, 4]), torch.tensor([2, 1])
    starts = torch.tensor([0, 3])
    ours, theirs = torch.zeros(7, RANK), torch.zeros(7, RANK)
    KERNELS["sgmv_shrink"](x, a, ours, starts, lengths, slots, 2, 4, 7, 1.0)
    torch_ops.sgmv_shrink(x, a, theirs, starts, lengths, slots, 2, 4, 7, 1.0)
    assert torch.allclose(ours, theirs, atol=1e-5)
    ours, theirs = torch.zeros(7, OUT), torch.zeros(7, OUT)
    KERNELS["sgmv_expand"](ours[:, :RANK].clone().normal_(), b, ours, starts, lengths, slots, 2, 4, 7, False)
    assert ours.abs().sum() > 0


def test_tokens_without_an_adapter_get_nothing():
    """vLLM's torch ops give them the last slot's adapter (weights[-1]); the GPU kernels skip them."""
    x, a, b, idx = _data([0, -1, -1, 1])
    shrunk = torch.full((4, RANK), 9.0)
    KERNELS["bgmv_shrink"](x, a, shrunk, idx, 1.0)
    assert torch.all(shrunk[1:3] == 0) and torch.all(shrunk[[0, 3]] != 9.0)
    theirs = torch.zeros(4, RANK)
    torch_ops.bgmv_shrink(x, a, theirs, idx, 1.0)
    assert torch.allclose(theirs[1], x[1] @ a[SLOTS - 1, 0].T, atol=1e-5)  # what vLLM did: the last slot
    out = torch.ones(4, OUT)
    KERNELS["bgmv_expand"](torch.randn(4, RANK), b, out, idx, True)
    assert torch.all(out[1:3] == 1) and not torch.all(out[0] == 1)


def test_shapes_the_runs_do_not_describe_go_to_vllms_function():
    """One index for many rows (a request's prompt logits) is vLLM's own case."""
    x, a, _, _ = _data([0, 0, 0])
    ours, theirs = torch.zeros(3, RANK), torch.zeros(3, RANK)
    KERNELS["bgmv_shrink"](x, a, ours, torch.tensor([1]), 1.0)
    torch_ops.bgmv_shrink(x, a, theirs, torch.tensor([1]), 1.0)
    assert torch.equal(ours, theirs)


def test_install_replaces_the_names_punica_cpu_calls():
    from vllm.lora.punica_wrapper import punica_cpu

    lora_cpu.install()
    assert all(getattr(punica_cpu, name).__module__ == "lmi_server.lora_cpu" for name in lora_cpu.NAMES)
    assert lora_cpu.install() is False  # once
