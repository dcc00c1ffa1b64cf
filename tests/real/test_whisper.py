"""openai-whisper: its ``AudioEncoder`` run through every command, and the whole ``Whisper``
built from its ``ModelDimensions`` dataclass by dotted ``-k dims.FIELD=VALUE`` keys.

The whole model's text decoder holds ``torch.empty`` position embeddings (a checkpoint fills
them), so its values are whatever memory held: it is checked on ``--device meta``, where
nothing needs values. The audio encoder's positions are a sinusoid table, so its figures
are reproducible and checked against plain PyTorch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks, hookcli_json, unique_numel

DIMS = {
    "n_mels": 80,
    "n_audio_ctx": 16,
    "n_audio_state": 32,
    "n_audio_head": 2,
    "n_audio_layer": 2,
    "n_vocab": 100,
    "n_text_ctx": 8,
    "n_text_state": 32,
    "n_text_head": 2,
    "n_text_layer": 2,
}
ENCODER = {"n_mels": 80, "n_ctx": 16, "n_state": 32, "n_head": 2, "n_layer": 2}


def encoder() -> nn.Module:
    return need("whisper.model").AudioEncoder(**ENCODER)


@contextlib.contextmanager
def layer_norm_in_own_dtype() -> Iterator[None]:
    """Whisper's ``LayerNorm`` normalises in float32 (``x.float()``), then casts back: for
    the float64 reference, the same normalisation in float64."""
    cls = need("whisper.model").LayerNorm
    saved = cls.forward
    cls.forward = nn.LayerNorm.forward
    try:
        yield
    finally:
        cls.forward = saved


class TestWhisperAudioEncoder(PackageChecks):
    # a log-mel batch: n_mels x 2*n_ctx frames (the second conv has stride 2)
    package = Package(
        module="whisper",
        spec="whisper.model:AudioEncoder",
        build=encoder,
        kwargs=ENCODER,
        inputs=("2x80x32",),
        seed=3,
        float64_patch=layer_norm_in_own_dtype,
    )


def test_whole_model_from_its_dimensions_on_meta() -> None:
    model = need("whisper.model")
    argv = ["inspect", "whisper.model:Whisper", "--device", "meta", "-f", "json"]
    for key, value in DIMS.items():
        argv += ["-k", f"dims.{key}={value!r}"]
    doc = hookcli_json([*argv, "-i", "2x80x32", "-i", "int64:2x8:0..100"])
    plain = model.Whisper(model.ModelDimensions(**DIMS))  # on CPU: to_sparse has no meta kernel
    assert doc["totals"]["params"] == unique_numel(plain)
    root = next(r for r in doc["layers"] if r["name"] == "")
    assert root["output_shapes"] == [[2, 8, DIMS["n_vocab"]]]
    assert {r["name"] for r in doc["layers"]} >= {"encoder", "decoder"}
