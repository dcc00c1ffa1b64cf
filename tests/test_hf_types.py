"""The transformers types issue 28's coverage run found failing, each on a small config.

Small configs are checked against plain transformers on the CPU (the model itself
raises on a wrong input) and against an independent count (``sum(p.numel())``); the
meta stand-ins on small hand-written modules whose CPU results are known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import invoke, invoke_json
from tests.test_hf_rules import _inputs

transformers = pytest.importorskip("transformers")


def _plain_params(model_type: str, **overrides: object) -> int:
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _k(**overrides: object) -> list[str]:
    return [a for k, v in overrides.items() for a in ("-k", f"{k}={json.dumps(v)}")]


# -- meta stand-ins -----------------------------------------------------------------------
def test_format_of_a_meta_index_with_known_values() -> None:
    """``f"expert_{idx}"`` (switch_transformers picks its expert module by name): a meta
    0-d tensor whose value is known formats as the number, as on the CPU."""
    from hookcli.metavalues import MetaValues

    with MetaValues():
        idx = torch.arange(4, device="meta")[2]
        assert f"expert_{idx}" == f"expert_{torch.arange(4)[2]}" == "expert_2"
        assert f"{idx:03d}" == "002"


def test_switch_transformers_routes_by_expert_name_on_meta() -> None:
    """Switch Transformers' experts are looked up as ``self[f"expert_{i}"]`` with ``i``
    from the routing: exit 0 on meta, every parameter counted, every expert run."""
    small = {"d_model": 32, "d_ff": 32, "d_kv": 16, "num_heads": 2, "num_experts": 4}
    small |= {"num_layers": 2, "num_decoder_layers": 2, "vocab_size": 100}
    # one sparse layer each (block 1): with the defaults' 12, two layers have none
    small |= {"num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1}
    report = invoke_json("inspect", "hf:switch_transformers", *_k(**small), "--device", "meta")
    assert report["totals"]["params"] == _plain_params("switch_transformers", **small)
    assert report["totals"]["params_not_run"] == 0
    stated = " ".join(report["settings"]["meta_assumptions"])
    assert "balanced across experts" in stated


_DURATIONS = '''
import torch
from torch import nn


class Durations(nn.Module):
    """A duration predictor and a length regulator (FastSpeech): each token repeated
    as many times as its predicted duration, the output as long as their sum."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 1)

    def forward(self, x):
        d = torch.clamp(torch.round(self.proj(x).squeeze(-1).exp() - 1), min=0).long()
        length = int(d.sum(dim=1).max())
        out = torch.zeros(x.shape[0], length, x.shape[2], device=x.device)
        for i in range(x.shape[0]):
            rep = torch.repeat_interleave(x[i], d[i], dim=0)
            out[i, : rep.shape[0]] = rep
        return out
'''


def test_integers_cast_from_unknown_floats_are_one_on_meta(tmp_path: Path) -> None:
    """Predicted durations (floats meta does not hold, cast to integers) are taken as 1
    and stated: the output is as long as the text, as on the CPU when every duration is 1."""
    path = tmp_path / "durations.py"
    path.write_text(_DURATIONS)
    report = invoke_json("inspect", f"{path}:Durations", "-i", "2x5x8", "--device", "meta")
    assert report["layers"][0]["output_shapes"] == [[2, 5, 8]]
    stated = " ".join(report["settings"]["meta_assumptions"])
    assert "taken as 1" in stated


def test_fastspeech2_with_hifigan_runs_on_meta() -> None:
    """The length regulator reads its predicted durations (``.item()``): on meta, with
    the durations taken as 1, the model and its vocoder run; params equal plain."""
    small = {"hidden_size": 32, "encoder_layers": 1, "decoder_layers": 1, "vocab_size": 100}
    small |= {"encoder_num_attention_heads": 2, "decoder_num_attention_heads": 2}
    small |= {"encoder_linear_units": 32, "decoder_linear_units": 32}
    small |= {"speech_decoder_postnet_units": 32, "duration_predictor_channels": 32}
    small |= {"pitch_predictor_channels": 32, "energy_predictor_channels": 32}
    vocoder = {"upsample_initial_channel": 32}
    args = _k(model_config=small, vocoder_config=vocoder)
    report = invoke_json(
        "inspect", "hf:fastspeech2_conformer_with_hifigan", *args, "--device", "meta"
    )
    plain = _plain_params(
        "fastspeech2_conformer_with_hifigan", model_config=small, vocoder_config=vocoder
    )
    assert report["totals"]["params"] == plain
    assert report["totals"]["params_not_run"] == 0


# -- input rules --------------------------------------------------------------------------
def test_text_and_audio_codebooks_in_one_id_tensor() -> None:
    """Kyutai speech-to-text embeds the text and 32 audio codebooks in one table: ids are
    ``1 x steps x (1 + num_codebooks)``, codes below ``codebook_vocab_size``; plain
    transformers runs on them and refuses the plain ``1 x steps`` text."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"num_key_value_heads": 2, "head_dim": 16, "ffn_dim": 32, "num_codebooks": 3}
    small |= {"codebook_vocab_size": 20, "vocab_size": 50, "audio_pad_token_id": 110}
    config, model, kwargs = _inputs("kyutai_speech_to_text", **small)
    ids = kwargs["input_ids"]
    assert ids.shape[0] == 1 and ids.shape[2] == 1 + config.num_codebooks
    assert int(ids[..., 0].max()) < config.vocab_size
    assert int(ids[..., 1:].max()) < config.codebook_vocab_size
    assert kwargs["attention_mask"].shape == ids.shape[:2]
    with torch.no_grad():
        out = model(**kwargs)
        assert out.last_hidden_state.shape == (1, ids.shape[1], 32)
        with pytest.raises(RuntimeError, match=r"size of tensor|broadcast"):
            model(input_ids=ids[..., 0])


def test_detection_image_splits_into_the_backbone_windows() -> None:
    """LW-DETR's ViT backbone splits the image into ``num_windows_side`` windows a side of
    whole patches: the default image processor's 800 x 800 does not split (plain
    transformers raises), the largest size below it that does (768) is given, and the
    backbone runs on it."""
    from hookcli.sources import hf

    backbone = {
        "model_type": "lw_detr_vit",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    }
    backbone |= {"image_size": 256, "window_block_indices": [0], "out_indices": [1, 2]}
    config, model, kwargs = _inputs("lw_detr", backbone_config=backbone)
    pixels = kwargs["pixel_values"]
    assert pixels.shape[-2:] == (768, 768)  # 800 down to whole windows of 4 x 16 pixels
    assert kwargs["pixel_mask"].shape == (1, 768, 768)
    assert hf._window_fit(config, torch.zeros(1, 3, 800, 800)) == (768, 768)
    assert hf._window_fit(config, pixels) is None
    with torch.no_grad():
        model.backbone.backbone(pixels)
        with pytest.raises(RuntimeError, match="invalid for input"):
            model.backbone.backbone(torch.randn(1, 3, 800, 800))


def test_audio_decoder_gets_latents() -> None:
    """VibeVoice's acoustic decoder takes latents (``hidden_size`` channels, one frame per
    hop), not audio: plain transformers decodes them, and refuses one audio channel."""
    small = {"hidden_size": 16, "num_filters": 4, "depths": [1, 1, 1], "kernel_size": 3}
    small |= {"downsampling_ratios": [2, 2]}
    config, model, kwargs = _inputs("vibevoice_acoustic_tokenizer_decoder", **small)
    latents = kwargs["hidden_states"]
    assert latents.shape[:2] == (1, config.hidden_size) and latents.shape[2] >= 1
    with torch.no_grad():
        audio = model(**kwargs).audio
        assert audio.shape[-1] == latents.shape[2] * 4
        with pytest.raises(RuntimeError, match="channel"):
            model(hidden_states=torch.randn(1, 1, 64))


def test_kyutai_and_the_decoder_report_on_meta() -> None:
    """Both through the CLI on meta, small: exit 0, params equal plain transformers."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"num_key_value_heads": 2, "head_dim": 16, "ffn_dim": 32, "num_codebooks": 3}
    small |= {"codebook_vocab_size": 20, "vocab_size": 50, "audio_pad_token_id": 110}
    report = invoke_json("inspect", "hf:kyutai_speech_to_text", *_k(**small), "--device", "meta")
    assert report["totals"]["params"] == _plain_params("kyutai_speech_to_text", **small)
    result = invoke("inspect", "hf:vibevoice_acoustic_tokenizer_decoder", "--device", "meta")
    assert result.exit_code == 0, result.stderr


def test_qformer_gets_queries_and_image_features() -> None:
    """BLIP-2's Q-Former takes query embeddings (``query_embeds``) and, in its
    cross-attention layers, image features: both of the config's widths; plain
    transformers runs on them and refuses the queries alone."""
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    small |= {"intermediate_size": 32, "encoder_hidden_size": 24}
    config, model, kwargs = _inputs("blip_2_qformer", **small)
    assert kwargs["query_embeds"].shape == (1, 32, config.hidden_size)
    assert kwargs["encoder_hidden_states"].shape[-1] == config.encoder_hidden_size
    with torch.no_grad():
        out = model(**kwargs)
        assert out.last_hidden_state.shape == (1, 32, config.hidden_size)
        with pytest.raises(ValueError, match="encoder_hidden_states"):
            model(query_embeds=kwargs["query_embeds"])


def test_character_model_gets_code_points() -> None:
    """CANINE has no vocabulary (it hashes Unicode code points): ids below its first
    special code point (0xE000), which plain transformers embeds."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"intermediate_size": 32, "num_hash_buckets": 256}  # also its position table
    config, model, kwargs = _inputs("canine", **small)
    ids = kwargs["input_ids"]
    assert ids.shape == (1, 128) and int(ids.min()) >= 0 and int(ids.max()) < 0xE000
    assert config.bos_token_id == 0xE000
    with torch.no_grad():
        model(**kwargs)


def test_trajectory_model_gets_states_actions_and_returns() -> None:
    """A Decision Transformer reads a trajectory: states and actions of the config's
    widths, rewards and returns to go, time steps below ``max_ep_len``; plain
    transformers predicts actions of ``act_dim`` from them."""
    small = {"hidden_size": 32, "n_layer": 1, "n_head": 2, "max_ep_len": 50, "n_positions": 60}
    config, model, kwargs = _inputs("decision_transformer", **small)
    steps = kwargs["states"].shape[1]
    assert kwargs["states"].shape == (1, steps, config.state_dim) and 3 * steps <= 60
    assert kwargs["actions"].shape == (1, steps, config.act_dim)
    assert int(kwargs["timesteps"].max()) < config.max_ep_len
    with torch.no_grad():
        out = model(**kwargs)
    assert out.action_preds.shape == (1, steps, config.act_dim)


def test_draft_model_gets_noise_and_target_context() -> None:
    """A block-diffusion draft model denoises ``block_size`` embeddings against the target
    model's hidden states, which its encoder projects from their own width: plain
    transformers runs on the derived inputs and refuses a context of the model's width."""
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16}
    config, model, kwargs = _inputs("muse_glimmer_assistant", **small)
    noise, context = kwargs["noise_embeds"], kwargs["context_hidden_states"]
    assert noise.shape == (1, config.block_size, config.hidden_size)
    assert context.shape[-1] == model.encoder.fc.in_features != config.hidden_size
    with torch.no_grad():
        out = model(**kwargs)
        assert out.last_hidden_state.shape == noise.shape
        with pytest.raises(RuntimeError):
            model(noise_embeds=noise, context_hidden_states=noise)


def test_audio_features_from_an_extractor_of_batches() -> None:
    """Gemma 4's audio feature extractor takes a batch of waveforms only (and its mask):
    the features it makes of one second, which plain transformers encodes."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"output_proj_dims": 16}
    _, model, kwargs = _inputs("gemma4_audio", **small)
    features = kwargs["input_features"]
    assert features.dim() == 3 and features.shape[0] == 1 and features.shape[-1] == 128
    with torch.no_grad():
        model(**kwargs)


class _AudioText(torch.nn.Module):
    """A text model with audio: ``get_audio_features`` gives 7 features per clip, and
    forward pads them to the config's ``audio_soft_tokens_per_image`` (as gemma3n's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def get_audio_features(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.proj(input_features.transpose(1, 2))[:, :7]

    def forward(self, input_ids, input_features=None, attention_mask=None):
        return input_ids


def test_audio_tokens_are_as_many_as_forward_pads_the_features_to() -> None:
    """gemma3n pads its audio features to ``audio_soft_tokens_per_image`` (188) before
    scattering them into the text: the text carries that many audio tokens, not the 7
    ``get_audio_features`` returns for one second."""
    from hookcli.sources import hf

    audio = transformers.PretrainedConfig(num_mel_bins=8, max_source_positions=10)
    config = transformers.PretrainedConfig(
        vocab_size=50, audio_token_id=49, audio_soft_tokens_per_image=12, audio_config=audio
    )
    specs, values = hf.default_inputs(_AudioText(), config)
    assert int((values["input_ids"] == 49).sum()) == 12
    assert any(s.startswith("input_features=") for s in specs)


def test_processor_outputs_under_forwards_pixel_names() -> None:
    """Gemma 4's vision tower takes ``pixel_position_ids``, which its image processor
    makes as ``image_position_ids``: passed under forward's name, and plain transformers
    encodes the patches with them."""
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16}
    _, model, kwargs = _inputs("gemma4_vision", **small)
    pixels, positions = kwargs["pixel_values"], kwargs["pixel_position_ids"]
    assert positions.shape == (*pixels.shape[:2], 2)
    with torch.no_grad():
        model(**kwargs)


def test_images_per_text_with_their_attention_mask() -> None:
    """IDEFICS takes ``batch x images x C x H x W`` and an ``image_attention_mask`` saying
    which image each text token sees (required: forward reads its size): one image, seen
    by every token; plain transformers runs on them."""
    vision = {"embed_dim": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"intermediate_size": 32, "image_size": 28, "patch_size": 14}
    perceiver = {"resampler_n_latents": 4, "resampler_depth": 1, "resampler_n_heads": 2}
    perceiver |= {"resampler_head_dim": 8}
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 2, "vocab_size": 100, "cross_layer_interval": 1}
    _, model, kwargs = _inputs("idefics", vision_config=vision, perceiver_config=perceiver, **small)
    pixels, mask = kwargs["pixel_values"], kwargs["image_attention_mask"]
    assert pixels.shape == (1, 1, 3, 28, 28)
    assert mask.shape == (*kwargs["input_ids"].shape, 1) and bool(mask.all())
    with torch.no_grad():
        model(**kwargs)


def test_patches_whole_for_a_2d_patch_convolution() -> None:
    """Kimi-K2.5's vision tower embeds each patch with a 2-D convolution as wide as the
    patch: patches as ``N x C x p x p`` (plain transformers refuses them flat), with
    their grid."""
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 2}
    config, model, kwargs = _inputs("kimi_k25_vision", **small)
    pixels, grid = kwargs["pixel_values"], kwargs["grid_thw"]
    p = config.patch_size
    assert pixels.shape[1:] == (3, p, p) and int(grid.prod(-1).sum()) == pixels.shape[0]
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(RuntimeError, match="conv2d"):
            model(pixel_values=pixels.flatten(1), grid_thw=grid)


def test_video_model_without_a_frame_count_gets_frames() -> None:
    """InstructBLIP-Video reads ``batch x frames x C x H x W`` and its config names no
    frame count: frames of the config's size (a 4-D image fails to unpack there)."""
    from hookcli.sources import hf

    config = transformers.AutoConfig.for_model("instructblipvideo")
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    specs, _ = hf.default_inputs(model, config)
    pixels = next(s for s in specs if s.startswith("pixel_values="))
    assert pixels.endswith(f"=1x{hf.DEFAULT_FRAMES}x3x224x224")


def test_codec_decoder_gets_latents_at_its_frame_rate() -> None:
    """Mimi's decoder takes continuous latents, ``hidden_size`` channels at its frame rate
    (12.5 Hz): one second of them, which plain transformers decodes to audio."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32}
    small |= {"num_filters": 4, "upsample_groups": 32}
    config, model, kwargs = _inputs("mimi_decoder", **small)
    latents = kwargs["latents"]
    assert latents.shape == (1, config.hidden_size, round(config.frame_rate))
    with torch.no_grad():
        audio = model(**kwargs).audio_values
    assert audio.shape[-1] >= config.sampling_rate * latents.shape[-1] / config.frame_rate


def test_images_left_out_where_the_config_names_no_image_token() -> None:
    """MiniCPM-V 4.7 places images by ``mm_token_type_ids``, and its default config names
    no image token to carry them (plain transformers refuses the image without them): the
    text alone, and the type reports on meta."""
    from hookcli.sources import hf

    config = transformers.AutoConfig.for_model("minicpmv4_7")
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    specs, _ = hf.default_inputs(model, config)
    assert [s.split("=")[0] for s in specs] == ["input_ids", "attention_mask"]
    result = invoke("inspect", "hf:minicpmv4_7", "--device", "meta", "-d", "0")
    assert result.exit_code == 0, result.stderr


def test_video_beside_the_text() -> None:
    """PE-Video scores text against a video, both required: ids and frames at the size of
    the video config's timm tower (a sub-config of a sub-config); plain transformers
    runs on them."""
    import timm

    tower = {"model_type": "timm_wrapper", "architecture": "vit_tiny_patch16_384"}
    tower |= {"num_classes": 32, "do_pooling": True, "global_pool": "map"}
    layers = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    layers |= {"num_attention_heads": 2}
    video = {"vision_config": tower, "num_key_value_heads": 2, **layers}
    text = {"model_type": "modernbert", "vocab_size": 100, **layers}
    text |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1}
    text |= {"sep_token_id": 2}
    _, model, kwargs = _inputs("pe_video", video_config=video, text_config=text)
    size = timm.get_pretrained_cfg("vit_tiny_patch16_384").input_size
    frames = kwargs["pixel_values_videos"]
    assert frames.dim() == 5 and tuple(frames.shape[2:]) == size
    assert int(kwargs["input_ids"].max()) < 100
    with torch.no_grad():
        model(**kwargs)


def test_windows_a_side_named_num_windows() -> None:
    """RF-DETR's DINOv2 backbone names its windows a side ``num_windows`` (4, of 14-pixel
    patches): 800 pixels go down to 784, and plain transformers' windowed embeddings take
    that size and refuse 800."""
    from hookcli.sources import hf

    backbone = {"model_type": "rf_detr_dinov2", "hidden_size": 32, "num_hidden_layers": 1}
    backbone |= {"num_attention_heads": 2, "out_indices": [1]}
    config, model, kwargs = _inputs("rf_detr", backbone_config=backbone)
    assert hf._window_fit(config, torch.zeros(1, 3, 800, 800)) == (784, 784)
    assert kwargs["pixel_values"].shape[-2:] == (784, 784)
    embeddings = model.backbone.backbone.embeddings
    with torch.no_grad():
        embeddings(kwargs["pixel_values"])
        with pytest.raises(RuntimeError, match="invalid for input"):
            embeddings(torch.randn(1, 3, 800, 800))


def test_univariate_series_one_a_row_with_padding_and_frequency() -> None:
    """TimesFM forecasts one series a row (``batch x steps``) and requires its padding
    indicator and frequency index: zeros, as a series with no padding at frequency 0;
    plain transformers runs on them and refuses the series without them."""
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    small |= {"num_attention_heads": 2, "head_dim": 16, "context_length": 64}
    config, model, kwargs = _inputs("timesfm", **small)
    assert kwargs["past_values"].shape == (1, config.context_length)
    assert not kwargs["past_values_padding"].any() and kwargs["freq"].tolist() == [0]
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(TypeError, match="required positional"):
            model(past_values=kwargs["past_values"])


_FILL = """
import torch
from torch import nn


class Fill(nn.Module):
    \"\"\"DeBERTa's masked softmax: the fill value a 0-d CPU tensor beside the scores.\"\"\"

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        y = self.l(x)
        y = y.masked_fill(y > 0, torch.tensor(torch.finfo(y.dtype).min))
        return torch.where(y > 0, y, torch.tensor(0.0))
"""


def test_a_cpu_scalar_fill_value_beside_meta_scores(tmp_path: Path) -> None:
    """``masked_fill(mask, torch.tensor(v))`` and ``torch.where(c, x, torch.tensor(v))``
    take a 0-d CPU value beside tensors on any device; on meta too (sew-d, deberta)."""
    path = tmp_path / "fill.py"
    path.write_text(_FILL)
    cpu = invoke_json("inspect", f"{path}:Fill", "-i", "2x4")
    meta = invoke_json("inspect", f"{path}:Fill", "-i", "2x4", "--device", "meta")
    assert meta["layers"] == cpu["layers"]


@pytest.mark.parametrize("model_type", ["hunyuan_vl_vision", "hy_v4_vl_vision"])
def test_flat_patches_where_the_embedding_reshapes_them(model_type: str) -> None:
    """HunYuan-VL's tower also embeds patches with a patch-wide 2-D convolution, but
    reshapes flat patches itself first (``num_patches, _ = pixel_values.shape``): flat
    patches for it, whole ones only where the input goes to the convolution as it is."""
    from hookcli.sources import hf

    config = transformers.AutoConfig.for_model(model_type)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    specs, _ = hf.default_inputs(model, config)
    dims = specs[0].split(":")[-1].split("x")
    assert len(dims) == 2 and int(dims[1]) == 3 * config.patch_size**2 * getattr(
        config, "temporal_patch_size", 1
    )


def test_video_frames_from_the_vision_config() -> None:
    """X-CLIP's vision tower counts its frames (``vision_config.num_frames``): videos of
    that many frames, which plain transformers scores against the text (a 4-D image fails
    to unpack there)."""
    layers = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    layers |= {"num_attention_heads": 2}
    vision = {**layers, "image_size": 32, "patch_size": 16, "num_frames": 3}
    vision |= {"mit_hidden_size": 32, "mit_intermediate_size": 32, "mit_num_hidden_layers": 1}
    vision |= {"mit_num_attention_heads": 2}
    _, model, kwargs = _inputs(
        "xclip",
        vision_config=vision,
        text_config={**layers, "vocab_size": 100},
        projection_dim=32,
        prompt_layers=1,
        prompt_num_attention_heads=2,
        prompt_attention_dropout=0.0,
        prompt_projection_dropout=0.0,
    )
    assert kwargs["pixel_values"].shape == (1, 3, 3, 32, 32)
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(ValueError, match="unpack"):
            model(**{**kwargs, "pixel_values": kwargs["pixel_values"][:, 0]})


def test_encoder_without_prenet_reads_hidden_states() -> None:
    """SpeechT5's base model is built without its speech or text prenets: it reads hidden
    states of its width (encoder and decoder), which plain transformers runs, and refuses
    raw audio."""
    small = {"hidden_size": 32, "encoder_layers": 1, "decoder_layers": 1}
    small |= {"encoder_attention_heads": 2, "decoder_attention_heads": 2}
    small |= {"encoder_ffn_dim": 32, "decoder_ffn_dim": 32}
    config, model, kwargs = _inputs("speecht5", **small)
    assert kwargs["input_values"].shape[-1] == config.hidden_size
    assert kwargs["decoder_input_values"].shape[-1] == config.hidden_size
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            model(input_values=torch.randn(1, 16000), decoder_input_values=kwargs["input_values"])


def test_features_as_wide_as_the_feature_projection() -> None:
    """Wav2Vec2-BERT projects stacked filterbank frames (``feature_projection_input_dim``,
    160): features that wide, which plain transformers encodes, not the raw audio that the
    feature extractor transformers maps to the type makes."""
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    small |= {"intermediate_size": 32, "output_hidden_size": 32}
    config, model, kwargs = _inputs("wav2vec2-bert", **small)
    assert kwargs["input_features"].shape[-1] == config.feature_projection_input_dim == 160
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            model(input_features=torch.randn(1, 16000))
