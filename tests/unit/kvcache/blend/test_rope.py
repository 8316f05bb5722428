"""RoPE re-rotation: K of a segment computed at positions p and moved to q equals K computed at q,
against our own forward rotation, against vLLM's rotary embedding, in float32 and bfloat16."""

import pytest
import torch

from lmi_server.kvcache.blend.rope import RopeConfigError, RopeSpec, rerotate, rotate
from tests.unit.kvcache.blend import model_configs as models

HEADS = 3


def segment_k(spec, n=48, dtype=torch.float32, seed=0):
    """K before rotation for one segment, [tokens, heads, head_dim]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HEADS, spec.head_dim, generator=g).to(dtype)


SPECS = {
    "smollm2 default": RopeSpec.from_hf_config(models.SMOLLM2_135M),
    "llama3.1 llama3 scaling": RopeSpec.from_hf_config(models.LLAMA31_8B),
    "qwen2.5": RopeSpec.from_hf_config(models.QWEN25_7B),
    "qwen3": RopeSpec.from_hf_config(models.QWEN3_8B),
    "partial rotary": RopeSpec.from_hf_config({**models.SMOLLM2_135M, "partial_rotary_factor": 0.5}),
    "linear scaling": RopeSpec.from_hf_config({**models.SMOLLM2_135M, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}}),
}


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("p0,q0", [(3000, 17), (5, 7900), (250, 250), (0, 1)])
def test_moved_k_equals_k_computed_at_the_new_position(name, p0, q0):
    spec = SPECS[name]
    k0 = segment_k(spec)
    p = torch.arange(p0, p0 + len(k0))
    q = torch.arange(q0, q0 + len(k0))
    moved = rerotate(rotate(k0, p, spec), p, q, spec)
    torch.testing.assert_close(moved, rotate(k0, q, spec), atol=1e-5, rtol=1e-5)


def test_bfloat16_k_moves_within_bfloat16_precision():
    spec = SPECS["llama3.1 llama3 scaling"]
    k0 = segment_k(spec)
    p, q = torch.arange(4000, 4048), torch.arange(100, 148)
    cached = rotate(k0, p, spec).to(torch.bfloat16)
    moved = rerotate(cached, p, q, spec)
    assert moved.dtype == torch.bfloat16
    torch.testing.assert_close(moved.float(), rotate(k0, q, spec), atol=2e-2, rtol=1.6e-2)


def test_flat_layout_scalar_positions_and_the_pass_through_part():
    spec = SPECS["partial rotary"]
    k0 = segment_k(spec)
    flat = rotate(k0, 9, spec).reshape(len(k0), -1)
    moved = rerotate(flat, 9, 40, spec)
    assert moved.shape == flat.shape
    torch.testing.assert_close(moved.reshape(k0.shape), rotate(k0, 40, spec), atol=1e-5, rtol=1e-5)
    # dimensions past rotary_dim carry no position
    assert torch.equal(moved.reshape(k0.shape)[..., spec.rotary_dim :], k0[..., spec.rotary_dim :])


def test_moving_does_not_change_the_input_and_zero_delta_is_identity():
    spec = SPECS["qwen3"]
    k = rotate(segment_k(spec), torch.arange(48), spec)
    before = k.clone()
    same = rerotate(k, torch.arange(48), torch.arange(48), spec)
    assert torch.equal(k, before)
    torch.testing.assert_close(same, k, atol=1e-6, rtol=1e-6)


def test_bad_shapes_and_positions_are_refused():
    spec = SPECS["smollm2 default"]
    with pytest.raises(ValueError):
        rerotate(torch.zeros(4, 3, 32), 0, 1, spec)
    with pytest.raises(ValueError):
        rerotate(torch.zeros(4, 100), 0, 1, spec)
    with pytest.raises(ValueError):
        rerotate(torch.zeros(4, 3, 64), torch.arange(3), 1, spec)
    with pytest.raises(ValueError):
        rerotate(torch.zeros(4, 3, 64), -1, 1, spec)


def test_geometry_read_from_hf_configs():
    assert SPECS["smollm2 default"] == RopeSpec(head_dim=64, rotary_dim=64, base=100000.0)
    llama = SPECS["llama3.1 llama3 scaling"]
    assert (llama.head_dim, llama.rope_type, llama.factor, llama.original_max_position) == (128, "llama3", 8.0, 8192)
    assert (SPECS["qwen2.5"].head_dim, SPECS["qwen2.5"].base) == (128, 1e6)
    assert SPECS["partial rotary"].rotary_dim == 32
    assert RopeSpec.from_hf_config({"hidden_size": 64, "num_attention_heads": 2}).base == 10000.0


@pytest.mark.parametrize(
    "config,words",
    [
        (models.QWEN25_YARN, "'yarn'"),
        ({**models.QWEN25_7B, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "length"),
        (models.GEMMA3_LIKE, "per layer type"),
        ({**models.QWEN25_7B, "rope_scaling": {"type": "default", "mrope_section": [16, 24, 24]}}, "mrope"),
        ({**models.QWEN25_7B, "partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        ({**models.LLAMA31_8B, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"rope_theta": 1e4}, "head_dim"),
    ],
)
def test_unsupported_rope_is_refused_with_the_reason(config, words):
    with pytest.raises(RopeConfigError, match=words):
        RopeSpec.from_hf_config(config)


@pytest.fixture(scope="module")
def vllm_rope():
    """vLLM's own rotary embedding (as the CPU engine builds it), or a skip where vLLM cannot load."""
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.model_executor.layers.rotary_embedding import get_rope
    except Exception as exc:  # noqa: BLE001 - any import failure means: no reference here
        pytest.skip(f"vLLM's rotary embedding does not import here: {exc}")

    def build(head_size, parameters):
        with set_current_vllm_config(VllmConfig()):
            return get_rope(head_size, 8192, True, parameters, torch.float32)

    return build


VLLM_CASES = {
    "default": (64, {"rope_theta": 100000.0, "rope_type": "default"}),
    "llama3": (128, {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "partial": (64, {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}),
}


@pytest.mark.parametrize("case", VLLM_CASES)
def test_matches_vllms_rotary_embedding(vllm_rope, case):
    head_dim, parameters = VLLM_CASES[case]
    engine = vllm_rope(head_dim, parameters)
    spec = RopeSpec.from_hf_config({"head_dim": head_dim, "rope_parameters": parameters})
    k0 = segment_k(spec, n=64).reshape(64, -1)
    p, q = torch.arange(7000, 7064), torch.arange(300, 364)

    def engine_k(positions):
        _, key = engine.forward_native(positions, torch.zeros_like(k0), k0.clone())
        return key

    # our forward rotation is the engine's, and a K the engine rotated at p moves to the engine's K at q
    torch.testing.assert_close(rotate(k0, p, spec), engine_k(p), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rerotate(engine_k(p), p, q, spec), engine_k(q), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rerotate(engine_k(q), q, p, spec), engine_k(p), atol=1e-5, rtol=1e-5)


def test_composition_is_what_keeps_far_moves_exact():
    """Rotating by cos/sin of (q - p) x inv_freq misses the engine's own rounding of its angles
    (about 1e-3 here, from position 7,000 to 300); composing the engine's cos/sin does not."""
    from lmi_server.kvcache.blend.rope import _apply

    spec = SPECS["smollm2 default"]
    k0 = segment_k(spec, n=64)
    p, q = torch.arange(7000, 7064), torch.arange(300, 364)
    at_q = rotate(k0, q, spec)
    naive = _apply(rotate(k0, p, spec), *spec.cos_sin(q - p), spec)
    assert (naive - at_q).abs().max() > 1e-4
    assert (rerotate(rotate(k0, p, spec), p, q, spec) - at_q).abs().max() < 1e-5
