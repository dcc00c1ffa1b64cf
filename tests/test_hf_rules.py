"""The family rules that give transformers models their default inputs from the config.

Small configs run on the CPU in plain transformers with the inputs the rule derived
(the model itself is the check: a wrong shape or layout raises there); the full-size
types, one per rule, run ``hookcli inspect hf:TYPE --device meta`` in a capped child
(exit 0, params equal plain ``AutoModel.from_config`` on meta, peak RSS <= 1.5 GiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_hf_coverage import _check_types

transformers = pytest.importorskip("transformers")


def _inputs(model_type: str, **overrides: object) -> tuple[object, object, dict]:
    """A small model of ``model_type`` on the CPU and the inputs hookcli derives for it."""
    from hookcli.sources import hf

    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    specs, values = hf.default_inputs(model, config)
    kwargs = {}
    for spec in specs:
        name, rest = spec.split("=", 1)
        if name in values:
            kwargs[name] = values[name]
            continue
        dims = [int(d) for d in rest.split(":")[1 if ":" in rest else 0].split("x")]
        kwargs[name] = torch.randn(dims)
    return config, model, kwargs


def test_grid_thw_tower_gets_patches_and_grid_from_config() -> None:
    """A Qwen2.5-VL vision tower: flat patches as wide as channels x temporal x patch^2,
    one row per grid cell, the grid a multiple of the merge size; the tower merges them."""
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32}
    config, model, kwargs = _inputs("qwen2_5_vl_vision", out_hidden_size=48, **vision)
    grid = kwargs["grid_thw"]
    t, rows, cols = (int(v) for v in grid[0])
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    assert kwargs["hidden_states"].shape == (t * rows * cols, width)
    assert rows % config.spatial_merge_size == 0 and cols % config.spatial_merge_size == 0
    with torch.no_grad():
        out = model(**kwargs)
    merged = out.pooler_output if hasattr(out, "pooler_output") else out
    assert merged.shape == (t * rows * cols // config.spatial_merge_size**2, 48)


def test_raw_audio_gets_the_channel_dim_of_the_feature_extractor() -> None:
    """EnCodec's raw audio: ``batch x audio_channels x samples`` as its feature extractor
    makes it, which plain EnCodec encodes."""
    config, model, kwargs = _inputs("encodec")
    wave = kwargs["input_values"]
    assert wave.dim() == 3 and wave.shape[1] == config.audio_channels
    with torch.no_grad():
        codes = model.encode(wave).audio_codes
    assert codes.shape[-1] > 0


def test_mel_features_follow_the_config_bins() -> None:
    """A Voxtral encoder whose config says 128 mel bins gets 128, not the extractor's 80."""
    config, model, kwargs = _inputs(
        "voxtral_encoder",
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=32,
        num_attention_heads=2,
    )
    assert kwargs["input_features"].shape[1] == config.num_mel_bins == 128
    with torch.no_grad():
        model(**kwargs)


def test_time_series_gets_context_length_steps() -> None:
    config, model, kwargs = _inputs("patchtsmixer", num_layers=1, d_model=16)
    assert kwargs["past_values"].shape == (1, config.context_length, config.num_input_channels)
    with torch.no_grad():
        model(**kwargs)


def test_region_features_and_language_from_config() -> None:
    """LXMERT's region features are as wide as ``visual_feat_dim``/``visual_pos_dim``;
    X-MOD's language is the first its config lists."""
    small = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 32}
    config, model, kwargs = _inputs("lxmert", l_layers=1, x_layers=1, r_layers=1, **small)
    assert kwargs["visual_feats"].shape[-1] == config.visual_feat_dim
    assert kwargs["visual_pos"].shape[-1] == config.visual_pos_dim
    with torch.no_grad():
        model(**kwargs)
    config, model, kwargs = _inputs("xmod", num_hidden_layers=1, vocab_size=100, **small)
    assert kwargs["lang_ids"].tolist() == [0] and config.languages
    with torch.no_grad():
        model(**kwargs)


def test_meta_build_keeps_cpu_shadows_of_tensors_made_with_an_explicit_device() -> None:
    """``torch.tensor(data, device="cpu")`` in ``__init__`` while building on meta: the
    tensor lands on meta and keeps its values, so reading them (``full_like(t, h[-1])``,
    ``int()``, ``F.pad`` with tensor sizes) works as on the CPU."""
    from hookcli.metavalues import KNOWN, MetaValues, building_on_meta

    with building_on_meta():
        h = torch.cumprod(torch.tensor([2, 7], device="cpu"), dim=0)
        filled = torch.full_like(h, h[-1])
        stride = torch.nn.Buffer(torch.tensor(3, dtype=torch.int64), persistent=False)
    assert h.device.type == "meta" and KNOWN[h].device.type == "cpu"
    assert KNOWN[filled].tolist() == [14, 14]
    x = torch.empty(1, 1, 10, device="meta")
    with MetaValues():
        assert int(stride) == 3
        assert torch.nn.functional.pad(x, (stride, stride)).shape == (1, 1, 16)


def test_meta_masks_with_known_values_stay_exact_under_inference_mode() -> None:
    """A token mask from known ids, expanded over the hidden size (``expand_as``) and
    used to pick rows of activations meta holds no values for, or turned into positions
    (``nonzero(as_tuple=True)``): the same counts and positions as on the CPU, and no
    stand-in stated."""
    from hookcli.inputs.grammar import meta_with_values
    from hookcli.metavalues import KNOWN, MetaValues

    ids = torch.tensor([[1, 7, 7, 3, 7, 2]])
    hidden = torch.zeros(1, 6, 5)
    cpu_mask = (ids == 7).unsqueeze(-1).expand_as(hidden)
    cpu_rows, cpu_cols = (ids == 7).nonzero(as_tuple=True)
    with MetaValues() as mv, torch.inference_mode():
        meta_ids = meta_with_values(ids)
        embeds = torch.empty(1, 6, 5, device="meta")
        mask = (meta_ids == 7).unsqueeze(-1).expand_as(embeds)
        picked = embeds[mask]
        rows, cols = (meta_ids == 7).nonzero(as_tuple=True)
        assert picked.shape == hidden[cpu_mask].shape
        assert KNOWN[rows].tolist() == cpu_rows.tolist()
        assert KNOWN[cols].tolist() == cpu_cols.tolist()
    assert not mv.assumed


def test_image_embeds_position_mask_marks_as_many_positions_as_image_features() -> None:
    """Kosmos-2 marks where the image goes by ``image_embeds_position_mask``, not by an
    image token: the text gets ``latent_query_num`` positions (what
    ``get_image_features`` returns) and the mask is one exactly there."""
    text = {"layers": 1, "embed_dim": 32, "ffn_dim": 32, "attention_heads": 2}
    vision = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32}
    config, model, kwargs = _inputs(
        "kosmos-2",
        text_config={**text, "vocab_size": 1000},
        vision_config={**vision, "num_attention_heads": 2},
        latent_query_num=8,
    )
    mask = kwargs["image_embeds_position_mask"]
    assert mask.shape == kwargs["input_ids"].shape
    assert int(mask.sum()) == config.latent_query_num == 8 and mask[0, 0] == 0
    with torch.no_grad():
        out = model(**kwargs)
    assert out.last_hidden_state.shape[1] == kwargs["input_ids"].shape[1]


def test_required_token_arguments_from_config() -> None:
    """OneFormer's ``task_inputs`` (required): token ids ``task_seq_len`` long, drawn
    below ``text_encoder_vocab_size``; plain OneFormer runs on them."""
    backbone = {"model_type": "swin", "embed_dim": 16, "depths": [1, 1, 1, 1]}
    backbone |= {
        "num_heads": [1, 1, 1, 1],
        "out_features": ["stage1", "stage2", "stage3", "stage4"],
    }
    small = {"hidden_dim": 32, "conv_dim": 32, "mask_dim": 32, "encoder_feedforward_dim": 32}
    small |= {"dim_feedforward": 32, "decoder_layers": 2, "encoder_layers": 1}
    small |= {"text_encoder_width": 32, "text_encoder_num_layers": 1, "num_attention_heads": 2}
    config, model, kwargs = _inputs(
        "oneformer", backbone_config=backbone, task_seq_len=8, text_encoder_vocab_size=100, **small
    )
    task = kwargs["task_inputs"]
    assert task.shape == (1, config.task_seq_len) and int(task.max()) < 100
    with torch.no_grad():
        model(**kwargs)


def test_mm_token_type_ids_label_the_image_tokens() -> None:
    """Qwen2-VL's M-RoPE needs the processor's ``mm_token_type_ids`` once an image is
    given: 1 on each image token, 0 elsewhere, as many ones as image features."""
    text = {"num_hidden_layers": 1, "hidden_size": 256, "intermediate_size": 64}
    text |= {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1000}
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 256, "num_heads": 2}
    config, model, kwargs = _inputs(
        "qwen2_vl",
        text_config=text,
        vision_config=vision,
        image_token_id=900,
        video_token_id=901,
        vision_start_token_id=902,
    )
    types = kwargs["mm_token_type_ids"]
    assert types.tolist() == (kwargs["input_ids"] == 900).long().tolist()
    merged = int(kwargs["image_grid_thw"].prod()) // config.vision_config.spatial_merge_size**2
    assert int(types.sum()) == merged > 0
    with torch.no_grad():
        model(**kwargs)


def test_prompt_images_from_the_image_processor() -> None:
    """SegGPT requires a prompt image and its mask: the default image processor makes
    them (its ``prompt_images``/``prompt_masks`` arguments) beside the image, at its own
    size, which plain SegGPT stacks to the config's ``image_size``."""
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    small |= {"mlp_dim": 32, "intermediate_hidden_state_indices": [0, 1], "merge_index": 0}
    config, model, kwargs = _inputs("seggpt", decoder_hidden_size=16, **small)
    pixels = kwargs["pixel_values"]
    assert kwargs["prompt_pixel_values"].shape == kwargs["prompt_masks"].shape == pixels.shape
    assert 2 * pixels.shape[-2] == config.image_size[0]
    with torch.no_grad():
        model(**kwargs)


def test_where_with_one_operand_on_meta() -> None:
    """``torch.where(cond)`` (OneFormer's decoder): exact positions from a shadow, and
    on a mask meta does not hold, every position (the stated ``mask`` stand-in)."""
    from hookcli.inputs.grammar import meta_with_values
    from hookcli.metavalues import KNOWN, MetaValues

    cond = torch.tensor([[True, False, True], [False, False, True]])
    with MetaValues() as mv:
        rows, cols = torch.where(meta_with_values(cond))
        assert [KNOWN[rows].tolist(), KNOWN[cols].tolist()] == [
            t.tolist() for t in torch.where(cond)
        ]
        assert not mv.assumed
        rows, cols = torch.where(torch.empty(2, 3, dtype=torch.bool, device="meta"))
        assert rows.shape == cols.shape == (6,)
    assert mv.assumed["mask"] == 1


def test_grid_thw_tower_reads_patch_temporal_and_merge_size() -> None:
    """A tower whose config names its patching ``patch_temporal``/``merge_size``
    (MUSE Glimmer): patches as wide as channels x patch_temporal x patch^2, the grid a
    multiple of ``merge_size``; plain transformers merges them."""
    small = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32}
    config, model, kwargs = _inputs(
        "muse_glimmer_vision", num_attention_heads=2, layer_types=["full_attention"], **small
    )
    t, rows, cols = (int(v) for v in kwargs["grid_thw"][0])
    width = 3 * config.patch_temporal * config.patch_size**2
    assert kwargs["pixel_values"].shape == (t * rows * cols, width)
    assert rows % config.merge_size == 0 and cols % config.merge_size == 0
    with torch.no_grad():
        out = model(**kwargs)
    assert out.last_hidden_state.shape[0] == t * rows * cols // config.merge_size**2


def test_list_index_on_meta_keeps_its_values() -> None:
    """``grid[:, [0, 2, 1]]`` on a meta tensor with known values: the list index keeps
    its values, so the result is known and ``repeat_interleave`` over it runs on meta."""
    from hookcli.inputs.grammar import meta_with_values
    from hookcli.metavalues import KNOWN, MetaValues

    grid = torch.tensor([[1, 4, 6]])
    with MetaValues() as mv:
        swapped = meta_with_values(grid)[:, [0, 2, 1]]
        assert KNOWN[swapped].tolist() == [[1, 6, 4]]
        heights = torch.repeat_interleave(swapped[:, 1], swapped.prod(-1))
        assert heights.shape == (24,)
    assert not mv.assumed


def test_image_pairs_from_a_processor_of_pairs() -> None:
    """EfficientLoFTR matches keypoints between two images: its image processor takes
    pairs only, so the image goes in twice (``1 x 2 x C x H x W``), which plain
    EfficientLoFTR matches."""
    _, model, kwargs = _inputs("efficientloftr")
    pixels = kwargs["pixel_values"]
    assert pixels.dim() == 5 and pixels.shape[:3] == (1, 2, 3)
    with torch.no_grad():
        model(**kwargs)


def test_timm_tower_image_size_from_timm_pretrained_cfg() -> None:
    """A video encoder over a timm tower (``timm_wrapper`` sub-config, no size field):
    frames at the ``input_size`` of timm's pretrained config for the architecture
    (384 for ``vit_tiny_patch16_384``), which the tower's patch embedding requires."""
    import timm

    tower = {"model_type": "timm_wrapper", "architecture": "vit_tiny_patch16_384"}
    tower |= {"num_classes": 32, "do_pooling": True, "global_pool": "map"}
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    _, model, kwargs = _inputs(
        "pe_video_encoder",
        vision_config=tower,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_frames=2,
        **small,
    )
    size = timm.get_pretrained_cfg("vit_tiny_patch16_384").input_size
    assert kwargs["pixel_values_videos"].shape == (1, 2, *size) and size[-1] == 384
    with torch.no_grad():
        model(**kwargs)


def test_text_from_the_model_config_subconfig() -> None:
    """FastSpeech2-Conformer with HiFi-GAN keeps its vocabulary in ``model_config``:
    token ids below it, which plain transformers turns into a waveform."""
    small = {"hidden_size": 32, "encoder_layers": 1, "decoder_layers": 1, "vocab_size": 100}
    small |= {"encoder_num_attention_heads": 2, "decoder_num_attention_heads": 2}
    small |= {"encoder_linear_units": 32, "decoder_linear_units": 32}
    small |= {"speech_decoder_postnet_units": 32, "duration_predictor_channels": 32}
    small |= {"pitch_predictor_channels": 32, "energy_predictor_channels": 32}
    _, model, kwargs = _inputs(
        "fastspeech2_conformer_with_hifigan",
        model_config=small,
        vocoder_config={"upsample_initial_channel": 32},
    )
    ids = kwargs["input_ids"]
    assert ids.dim() == 2 and int(ids.max()) < 100
    with torch.no_grad():
        out = model(**kwargs)
    assert out.waveform.numel() > 0


def test_layout_boxes_one_per_token() -> None:
    """UDOP's encoder reads ``bbox`` with no default of its own: a box per token, all
    zeros (what layoutlm's forward makes when none is given); without it plain UDOP
    fails, with it UDOP runs."""
    small = {"d_model": 32, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_decoder_layers": 1}
    _, model, kwargs = _inputs("udop", num_heads=2, vocab_size=1000, **small)
    bbox = kwargs["bbox"]
    assert bbox.shape == (*kwargs["input_ids"].shape, 4) and not bbox.any()
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(TypeError):
            model(**{k: v for k, v in kwargs.items() if k != "bbox"})


def test_codebook_decoder_ids_from_the_decoder_config() -> None:
    """Dia's decoder reads parallel audio codebooks: ``batch x steps x num_channels``
    ids below the decoder config's vocabulary (not the byte encoder's), step 0 the
    start token. Its other documented layout, ``batch * codebooks x steps``, fails in
    plain Dia on the CPU (a ``view`` after forward's own transpose)."""
    layers = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16}
    cross = {"cross_num_attention_heads": 2, "cross_head_dim": 16}
    cross |= {"cross_num_key_value_heads": 2, "cross_hidden_size": 32}
    config, model, kwargs = _inputs(
        "dia", encoder_config={**layers, **heads}, decoder_config={**layers, **heads, **cross}
    )
    dec, books = kwargs["decoder_input_ids"], config.decoder_config.num_channels
    assert dec.shape[0] == 1 and dec.shape[2] == books == 9
    assert int(dec.max()) < config.decoder_config.vocab_size
    assert dec[0, 0].tolist() == [config.decoder_config.bos_token_id] * books
    with torch.no_grad():
        model(**kwargs)
        with pytest.raises(RuntimeError, match="view size"):
            model(**{**kwargs, "decoder_input_ids": dec[0].T.contiguous()})


# one type per rule, at full default size on meta
RULE_TYPES = [
    "qwen2_5_vl_vision",  # grid_thw tower
    "exaone4_5_vision",  # grid_thw tower
    "dac",  # raw audio, channel dim from the feature extractor
    "encodec",  # the same, with tensor-valued conv paddings made in __init__
    "voxtral_encoder",  # mel bins from the config
    "vibevoice_acoustic_tokenizer_encoder",  # audio main input named otherwise in forward
    "depth_pro",  # image size from the image processor
    "minicpm_ocr_vision",  # image processor patched as the config
    "timesformer",  # video by num_frames
    "videoprism_vision_model",  # a video tower (pixel_values_videos)
    "glmasr",  # audio tokens in the text, as many as get_audio_features returns
    "qwen3_asr_encoder",  # the feature mask forward requires
    "patchtsmixer",  # time series
    "lxmert",  # region features
    "xmod",  # language ids
    "perceiver",  # embeddings in
    "sam3_lite_text",  # text beside a vision main input
    "inkling_mm_model",  # build reads values of tensors made with device="cpu"
    "led",  # a padding mask cast to float, then nonzero(as_tuple=True) on meta
    "kosmos-2",  # image positions marked by a mask over the text
    "oneformer",  # required token arguments (task_inputs); torch.where(cond) on meta
    "hy_v4_vl",  # mm_token_type_ids
    "seggpt",  # prompt images from the image processor
    "muse_glimmer_vision",  # patch_temporal / merge_size; a list index on meta
    "efficientloftr",  # image pairs, as the image processor makes them
    "pe_video_encoder",  # a timm tower's size from timm's pretrained config
    "udop",  # a box per token
    "dia",  # codebook decoder ids from the decoder config
]


@pytest.mark.slow  # a capped interpreter per type, each importing torch and transformers
@pytest.mark.parametrize("model_type", RULE_TYPES)
def test_rule_types_report_at_full_size_on_meta(model_type: str) -> None:
    _check_types([model_type])


@pytest.mark.slow  # imports torch and transformers in a child, then forks one per type
def test_coverage_benchmark_reports_an_ok_type(tmp_path: Path) -> None:
    """``benchmarks/hf_coverage.py`` on one type: ok, with params equal plain transformers
    (its forked child ends with the real ``os._exit``, not hookcli's guarded one)."""
    from tests.test_hf_coverage import ROOT

    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/hf_coverage.py", "--json", str(out), "bert"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"], row
    assert row["params_match"] and row["params"] == row["plain_params"] > 0
    assert row["class"] == "ok" and row["moe"] is False
