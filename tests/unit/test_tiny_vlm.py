"""scripts/train_tiny_vlm.py without training: the synthetic pictures are deterministic and the
held-out split never shares a picture with training; tokenizer, image processor and config fit
vLLM's CPU constraints; the shipped tiny Qwen2-VL directory (lmi_server/demo/vlm) is complete,
small, and its processor loads here without torchvision."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_tiny_vlm.py"
CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}  # vLLM 0.32 CPU attention backend


@pytest.fixture(scope="module")
def tv():
    spec = importlib.util.spec_from_file_location("train_tiny_vlm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny_vlm"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_pictures_are_deterministic(tv):
    a_train, a_held = tv.make_split(7, 50, 20)
    b_train, b_held = tv.make_split(7, 50, 20)
    assert a_train == b_train and a_held == b_held
    assert tv.draw(a_train[0]).tobytes() == tv.draw(b_train[0]).tobytes()
    assert tv.make_split(8, 50, 20)[0] != a_train


def test_held_out_split_is_disjoint(tv):
    train, held = tv.make_split(3, 3000, 300)
    assert len(held) == 300
    assert not ({f.key() for f in train} & {f.key() for f in held})
    # the shorter held-out set is a prefix of a longer one (checks can ask more pictures)
    assert tv.make_split(3, 3000, 50)[1] == held[:50]


def test_pictures_show_the_figure(tv):
    from PIL import Image

    train, _ = tv.make_split(11, 40, 1)
    for f in train:
        img = tv.draw(f)
        assert img.size == (tv.IMAGE_SIZE, tv.IMAGE_SIZE) and img.mode == "RGB"
        centre = img.getpixel((f.x + f.size // 2, f.y + f.size * 2 // 3))
        want = tuple(max(0, min(255, c + j)) for c, j in zip(tv.COLOURS[f.colour], f.jitter))
        assert centre == want, (f, centre)
        assert img.getpixel((0, 0)) in (tv.BACKGROUNDS[f.background], want)
        assert isinstance(img, Image.Image)


def test_answers(tv):
    f = tv.Figure("circle", "red", 20, 1, 2, 0, (0, 0, 0))
    assert [tv.answer(f, k) for k in tv.KINDS] == ["red", "circle", "a red circle"]
    assert set(tv.KINDS) == {"colour", "shape", "describe"}


def test_tokenizer_and_chat_template(tv):
    tok = tv.build_tokenizer(320)
    assert len(tok) == 320
    for t in tv.SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) != tok.unk_token_id
        assert tok.tokenize(t) == [t]
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "What shape is it?"}]}],
        tokenize=False, add_generation_prompt=True,
    )
    assert text == tv.prompt_text("What shape is it?")
    ids = tok("a red circle", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "a red circle"


def test_image_processor_patches(tv):
    ip = tv.build_image_processor()
    train, _ = tv.make_split(1, 2, 1)
    out = ip([tv.draw(f) for f in train], return_tensors="pt")
    side = tv.IMAGE_SIZE // tv.PATCH
    assert out["image_grid_thw"].tolist() == [[1, side, side]] * 2
    assert tuple(out["pixel_values"].shape) == (2 * side * side, 3 * 2 * tv.PATCH * tv.PATCH)


def test_config_fits_vllm_cpu(tv):
    cfg = tv.build_config(tv.build_tokenizer(320), tv.Shape())
    text = cfg.text_config
    head_dim = text.hidden_size // text.num_attention_heads
    assert head_dim in CPU_HEAD_SIZES
    assert sum(text.rope_parameters["mrope_section"]) * 2 == head_dim
    assert cfg.vision_config.hidden_size == text.hidden_size
    assert cfg.image_token_id == 5 and cfg.vision_start_token_id == 3 and cfg.vision_end_token_id == 4


# ---- the shipped directory


def _shipped():
    from lmi_server.demo import vision

    try:
        return vision.vlm_dir()
    except FileNotFoundError:
        pytest.skip("lmi_server/demo/vlm not built")


def test_shipped_model_is_complete_and_small():
    d = _shipped()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "chat_template.jinja", "generation_config.json"):
        assert (d / name).is_file(), name
    total = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert total < 5 * 1024 * 1024, total
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2VLForConditionalGeneration"]


def test_shipped_processor_loads_without_torchvision():
    from transformers import Qwen2VLProcessor

    from lmi_server.demo import vision

    d = _shipped()
    vision.allow_image_only_processors()
    assert vision.allow_image_only_processors() in (True, False)  # idempotent
    p = Qwen2VLProcessor.from_pretrained(str(d))
    from PIL import Image

    out = p(text=[p.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the shape?"}]}],
        tokenize=False, add_generation_prompt=True)], images=[Image.new("RGB", (56, 56), (255, 0, 0))])
    cfg = json.loads((d / "preprocessor_config.json").read_text())
    side = 56 // cfg["patch_size"]
    assert out["image_grid_thw"].tolist() == [[1, side, side]]
    assert out["input_ids"][0].count(p.tokenizer.convert_tokens_to_ids("<|image_pad|>")) == side * side // 4
