"""The tiny vision-language demo model: a Qwen2-VL (Qwen2VLForConditionalGeneration) of about 0.6M
parameters trained from scratch by scripts/train_tiny_vlm.py to answer questions about one figure
(circle, square or triangle; red, green, blue, yellow, purple or orange) in a 56x56 picture:
"What colour is the shape?" -> "red", "What shape is it?" -> "circle",
"Describe the figure." -> "a red circle". It ships in the package (lmi_server/demo/vlm, about
2.4 MB in float32), so it is read in place like the demo kit's draft.

transformers 5.19 builds Qwen2-VL's processor with a video processor, and its video processors need
torchvision, which this CPU build cannot have (PyPI's torchvision is a CUDA build and breaks
`import vllm` beside torch+cpu). allow_image_only_processors() lets the processor load without a
video processor when torchvision is missing, so images still work and videos are refused. It has to
run in every process that builds the processor (vLLM's API server and its engine core).
"""

from __future__ import annotations

from pathlib import Path

VLM_DIR = Path(__file__).resolve().parent / "vlm"
SERVED_NAME = "tiny-qwen2-vl-shapes"


def vlm_dir() -> Path:
    """The shipped tiny Qwen2-VL directory; FileNotFoundError when it is not there."""
    if (VLM_DIR / "config.json").is_file() and (VLM_DIR / "model.safetensors").is_file():
        return VLM_DIR
    raise FileNotFoundError(
        f"the tiny vision-language model is missing under {VLM_DIR}; train it with: "
        "python scripts/train_tiny_vlm.py --out lmi_server/demo/vlm"
    )


_PATCHED = False


class NoVideoProcessor(dict):
    """Stands for a video processor where torchvision is missing: it names the keyword arguments a
    video processor takes (vLLM reads them) and refuses any video."""

    def __init__(self) -> None:
        from transformers.processing_utils import VideosKwargs

        super().__init__()
        self.valid_kwargs = VideosKwargs

    def __call__(self, *args, **kwargs):
        raise ValueError("videos need torchvision, which is not installed; this server reads images only")

    def to_dict(self) -> dict:
        return {}


def torchvision_usable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or a CUDA build that fails beside torch+cpu
        return False
    return True


def _alias_torchvision_free_image_module() -> None:
    """vLLM's qwen2_vl model file imports smart_resize from transformers' torchvision image processor
    module, whose import fails without torchvision; the PIL module has the same function."""
    import importlib
    import sys
    import types

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        importlib.import_module(name)
        return
    except ImportError:
        sys.modules.pop(name, None)
    pil = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    alias = types.ModuleType(name, "torchvision-free stand-in (lmi_server.demo.vision)")
    alias.smart_resize = pil.smart_resize
    alias.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    alias.__getattr__ = lambda attr: getattr(pil, attr)
    sys.modules[name] = alias


def allow_image_only_processors() -> bool:
    """Without a usable torchvision, let transformers build multimodal processors (Qwen2-VL's and
    the like) with `video_processor=None` instead of failing; returns True when it patched.

    Only the loading changes: AutoVideoProcessor.from_pretrained answers None when the video
    processor class needs torchvision, and a processor accepts None for its video_processor.
    Image inputs are processed as before; a video input then fails inside the processor."""
    global _PATCHED
    if _PATCHED:
        return True
    if torchvision_usable():
        return False
    _alias_torchvision_free_image_module()
    # The real class (transformers' top-level AutoVideoProcessor is a placeholder without torchvision).
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor
    from transformers.processing_utils import ProcessorMixin

    auto_from_pretrained = AutoVideoProcessor.from_pretrained.__func__
    check = ProcessorMixin.check_argument_for_proper_class

    def from_pretrained(cls, *args, **kwargs):
        try:
            return auto_from_pretrained(cls, *args, **kwargs)
        except ImportError:  # the video processor class requires torchvision
            return NoVideoProcessor()

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and (argument is None or isinstance(argument, NoVideoProcessor)):
            return None
        return check(self, argument_name, argument)

    AutoVideoProcessor.from_pretrained = classmethod(from_pretrained)
    ProcessorMixin.check_argument_for_proper_class = check_argument_for_proper_class
    _PATCHED = True
    return True


def vllm_plugin() -> None:
    """vLLM's `vllm.general_plugins` entry point (pyproject.toml): vLLM calls it in each of its
    processes before it builds a processor, so an image-only processor loads wherever vLLM needs
    one. Where torchvision works it changes nothing."""
    try:
        allow_image_only_processors()
    except Exception as exc:  # never stop vLLM from starting over this: a multimodal model then fails as before
        import logging

        logging.getLogger(__name__).warning("image-only processor loading not enabled: %s", exc)
