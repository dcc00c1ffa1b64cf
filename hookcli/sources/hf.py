"""``hf:NAME[:HEAD]``: a transformers model built from its config, never downloaded.

NAME is a model type (``llama``, ``gpt2``, ``bert``, ``t5``, ``vit``...), a local
folder holding ``config.json``, or a Hub id whose config is already in the
local Hugging Face cache. ``-k KEY=VALUE`` sets config attributes. HEAD picks a
task head (``HEADS``); the base model (``AutoModel``) without one.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, UsageError, first_line

if TYPE_CHECKING:
    from hookcli.sources import LoadedModel

# HEAD -> the transformers Auto class that builds it
HEADS = {
    "base": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "image-classification": "AutoModelForImageClassification",
    "pretraining": "AutoModelForPreTraining",
}
_ALIASES = {"seq-cls": "sequence-classification", "token-cls": "token-classification"}
DEFAULT_TEXT_LENGTH = 128
DEFAULT_FRAMES = 8  # video frames where the config says none


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hookcli never downloads
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers
    except ImportError as err:
        raise LoadError(
            f"hf: models need transformers: pip install 'hookcli[hf]' ({first_line(err)})"
        ) from err
    transformers.logging.set_verbosity_error()
    return transformers


def names() -> list[str]:
    """Every model type this transformers knows."""
    tf = _transformers()
    return sorted(tf.models.auto.configuration_auto.CONFIG_MAPPING.keys())


def _split(name: str) -> tuple[str, str]:
    """``llama:causal-lm`` -> (``llama``, ``causal-lm``)."""
    base, sep, head = name.rpartition(":")
    if not sep or "/" in head or head.endswith(".json"):
        return name, "base"
    head = _ALIASES.get(head, head)
    if head not in HEADS:
        close = difflib.get_close_matches(head, list(HEADS), n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(f"unknown hf head {head!r}{hint} (choose from {', '.join(HEADS)})")
    return base, head


def _reason(err: BaseException) -> str:
    """``first_line``, completed where that line only announces the reason: huggingface_hub's
    strict dataclasses (transformers' configs) say "Validation error for field 'x':" and
    give the reason on the next line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    text = lines[0]
    for line in lines[1:]:
        if not text.endswith(":"):
            break
        text = f"{text} {line}"
    return f"{type(err).__name__}: {text}"


def _refused(err: BaseException) -> bool:
    """transformers refused a config value (huggingface_hub's StrictDataclassError)."""
    return any(c.__name__ == "StrictDataclassError" for c in type(err).__mro__)


def _config(tf: Any, name: str, overrides: dict[str, Any]) -> Any:
    mapping = tf.models.auto.configuration_auto.CONFIG_MAPPING
    if name in mapping:
        try:
            return tf.AutoConfig.for_model(name, **overrides)
        except Exception as err:  # -k values transformers refuses: its reason, exit 3
            raise LoadError(f"transformers refused hf:{name}'s config: {_reason(err)}") from err
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise LoadError(f"hf:{name} is a folder without config.json")
        try:
            return tf.AutoConfig.from_pretrained(str(folder), local_files_only=True, **overrides)
        except Exception as err:
            raise LoadError(f"cannot read {folder / 'config.json'}: {_reason(err)}") from err
    try:
        return tf.AutoConfig.from_pretrained(name, local_files_only=True, **overrides)
    except Exception as err:
        if _refused(err):  # found in the cache, and its values refused
            raise LoadError(f"transformers refused hf:{name}'s config: {_reason(err)}") from err
        close = difflib.get_close_matches(name, list(mapping.keys()), n=3, cutoff=0.6)
        hint = f"; did you mean hf:{', hf:'.join(close)}?" if close else ""
        raise LoadError(
            f"hf:{name} is not a transformers model type, a local folder with config.json, "
            f"or a Hub id in the local Hugging Face cache (hookcli never downloads){hint}"
        ) from err


def _warn_unknown(config: Any, overrides: dict[str, Any]) -> None:
    """A -k key the config class does not define is most likely a typo: say so."""
    try:
        known = set(type(config)().to_dict())
    except Exception:  # a config class that needs arguments: nothing to compare with
        return
    for key in overrides:
        if key not in known:
            print(
                f"hookcli: note: {type(config).__name__} has no attribute {key!r}; set anyway",
                file=sys.stderr,
                flush=True,
            )


# a config field that holds a size or a count (never negative in a default config)
_SIZE_KEY = re.compile(
    r"^(num|n)_|_(size|layers|heads|dim|channels|embeddings|experts)$|^(d_model|hidden_size)$"
)


def _negative_sizes(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """``KEY=VALUE`` of the sizes and counts below 0, except where the default config has
    a negative value itself (a sentinel: ``vilt``'s ``max_image_length = -1``)."""
    out = []
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value >= 0:
            continue
        default = defaults.get(key)
        if isinstance(default, int) and default < 0:
            continue
        if _SIZE_KEY.search(key) and "chunk" not in key and not key.startswith("max_"):
            out.append(f"{key}={value}")
    return out


def _defaults(config_class: Any) -> dict[str, Any] | None:
    """The default config of a config class as a dict; None where it needs arguments."""
    try:
        return dict(config_class().to_dict())
    except Exception:
        return None


def _check_given(tf: Any, name: str, model_name: str, given: Mapping[str, Any]) -> None:
    """Negative sizes among the ``-k`` values, before transformers checks them its own way
    (``hidden_size=-1`` would be "not a multiple of the number of attention heads")."""
    mapping = tf.models.auto.configuration_auto.CONFIG_MAPPING
    defaults = _defaults(mapping[model_name]) if model_name in mapping else None
    bad = _negative_sizes(given, defaults or {})
    if bad:
        raise LoadError(f"hf:{name}: {', '.join(bad)}: a size or count cannot be negative")


def _check_sizes(name: str, config: Any, given: Mapping[str, Any]) -> None:
    """A negative size or count (``-k num_hidden_layers=-1``, or one in config.json) is
    exit 3: transformers takes most of them and builds a model without those layers."""
    for cfg in _configs(config):
        defaults = _defaults(type(cfg))
        # without a default to compare with, only what was given is checked
        values = vars(cfg) if defaults is not None else {}
        bad = _negative_sizes({**values, **(given if cfg is config else {})}, defaults or {})
        if bad:
            where = "" if cfg is config else f" ({type(cfg).__name__})"
            raise LoadError(
                f"hf:{name}: {', '.join(bad)}{where}: a size or count cannot be negative"
            )


def _check_text(name: str, module: Any, config: Any, specs: tuple[str, ...]) -> None:
    """A text model whose vocabulary is empty has no token id to draw: say so, not "no
    input known"."""
    vocab = _get(config, "vocab_size")
    text = "input_ids" in _params(module)
    if not specs and text and isinstance(vocab, int) and not isinstance(vocab, bool) and vocab < 1:
        raise LoadError(
            f"hf:{name}: the config makes no valid input: vocab_size={vocab} leaves no token "
            "id for input_ids (vocab_size must be at least 1)"
        )


# config fields some default configs leave None although forward needs a number
# (DeepseekV2Config: num_experts_per_tok): the value hookcli uses, with a note
UNSET_FILLS = {"num_experts_per_tok": 2}


def _fill_unset(config: Any, given: dict[str, Any]) -> None:
    """Fill the ``UNSET_FILLS`` fields a default config leaves None, saying so on stderr."""
    for cfg in _configs(config):
        for key, value in UNSET_FILLS.items():
            if key in given or not hasattr(cfg, key) or getattr(cfg, key) is not None:
                continue
            setattr(cfg, key, value)
            print(
                f"hookcli: note: {type(cfg).__name__} leaves {key} unset and its forward needs "
                f"it; using {value} (-k {key}=N to choose)",
                file=sys.stderr,
                flush=True,
            )


def build(name: str, kwargs: dict[str, Any], seed: int) -> LoadedModel:
    """Build ``hf:NAME[:HEAD]`` from its config, seeded, with default inputs from the config."""
    import torch

    from hookcli.sources import LoadedModel

    tf = _transformers()
    model_name, head = _split(name)
    overrides = dict(kwargs)
    overrides.setdefault("use_cache", False)  # no key/value cache in the outputs
    _check_given(tf, name, model_name, kwargs)
    config = _config(tf, model_name, overrides)
    _check_sizes(name, config, kwargs)
    _warn_unknown(config, kwargs)
    _fill_unset(config, kwargs)
    auto = getattr(tf, HEADS[head])
    torch.manual_seed(seed)
    try:
        module = auto.from_config(config)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):
            raise LoadError(
                f"hf:{model_name} has no {head} head "
                f"({type(config).__name__} is not among {HEADS[head]}'s models)"
            ) from err
        raise LoadError(f"could not build hf:{name}: {_reason(err)}") from err
    except Exception as err:
        raise LoadError(f"could not build hf:{name}: {_reason(err)}") from err
    if not isinstance(module, torch.nn.Module):
        raise LoadError(f"hf:{name} built a {type(module).__name__}, not an nn.Module")
    from hookcli.metavalues import plain

    with plain():  # the inputs are drawn on the cpu, also while building on meta
        specs, values = default_inputs(module, config)
    _check_text(name, module, config, specs)
    return LoadedModel(
        module=module,
        spec=f"hf:{name}",
        default_inputs=specs,
        input_source="hf config default",
        input_values=values,
    )


_SUBCONFIGS = (
    "text_config",
    "vision_config",
    "audio_config",
    "encoder",
    "decoder",
    "backbone_config",
    "encoder_config",
    "decoder_config",
    "model_config",
    "video_config",
)


def _configs(config: Any) -> list[Any]:
    """The config and its sub-configs (text, vision, audio, encoder, backbone), in order."""
    subs = [config]
    for sub in _SUBCONFIGS:
        value = getattr(config, sub, None)
        if value is not None and not isinstance(value, (dict, str, bool, int)):
            subs.append(value)
    # then a video config's own sub-configs (``pe_video``'s timm tower), after all others
    video = getattr(config, "video_config", None)
    if video is not None and not isinstance(video, (dict, str, bool, int)):
        subs += [s for s in _configs(video)[1:] if all(s is not t for t in subs)]
    return subs


def _get(config: Any, *keys: str) -> Any:
    """The first of ``keys`` set on the config or its sub-configs."""
    for cfg in _configs(config):
        for key in keys:
            value = getattr(cfg, key, None)
            if value is not None:
                return value
    return None


_SIZE_KEYS = ("image_size", "img_size", "input_size", "crop_size")


def _image_size(config: Any) -> tuple[int, int]:
    """(height, width) from ``image_size``-like config fields; 224 where none says."""
    size = _get(config, *_SIZE_KEYS)
    if isinstance(size, dict):
        size = [size.get("height", size.get("shortest_edge")), size.get("width")]
        size = [v for v in size if isinstance(v, int)]
    if isinstance(size, (list, tuple)) and size and all(isinstance(v, int) for v in size):
        return (size[-2], size[-1]) if len(size) >= 2 else (size[0], size[0])
    if isinstance(size, int) and size > 0:
        return size, size
    timm_size = _timm_size(config)
    if timm_size is not None:
        return timm_size
    return 224, 224


def _timm_size(config: Any) -> tuple[int, int] | None:
    """A timm tower's (``timm_wrapper`` sub-config) input size: the ``input_size`` of
    timm's own pretrained config for its ``architecture``."""
    for cfg in _configs(config):
        arch = getattr(cfg, "architecture", None)
        if getattr(cfg, "model_type", None) != "timm_wrapper" or not isinstance(arch, str):
            continue
        given = getattr(cfg, "pretrained_cfg", None)
        size = given.get("input_size") if isinstance(given, dict) else None
        if size is None:
            try:
                import timm

                size = getattr(timm.get_pretrained_cfg(arch), "input_size", None)
            except Exception:
                return None
        if isinstance(size, (list, tuple)) and len(size) >= 2:
            return int(size[-2]), int(size[-1])
    return None


def _params(module: Any) -> list[str]:
    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return []


def _params_of(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters) if fn is not None else []
    except (TypeError, ValueError):
        return []


def _processor_class(config: Any, kind: str) -> Any:
    """transformers' default image processor or feature extractor class for this type
    (for ``gemma3n_audio`` the one of ``gemma3n``), or None."""
    from transformers.models.auto import feature_extraction_auto as fa
    from transformers.models.auto import image_processing_auto as ia

    mapping: Any = (
        ia.IMAGE_PROCESSOR_MAPPING_NAMES if kind == "image" else fa.FEATURE_EXTRACTOR_MAPPING_NAMES
    )
    model_type = str(getattr(config, "model_type", ""))
    parts = model_type.split("_")
    for n in range(len(parts), 0, -1):
        entry = mapping.get("_".join(parts[:n]))
        if entry is None:
            continue
        name = entry.get("torchvision") or entry.get("pil") if isinstance(entry, dict) else entry
        if not isinstance(name, str):
            return None
        try:
            if kind == "image":
                return ia.get_image_processor_class_from_name(name)
            return fa.feature_extractor_class_from_name(name)
        except Exception:
            return None
    return None


def _special_ids(config: Any) -> set[int]:
    """Every ``*_token_id``/``*_token_index`` of the config: ids random text must avoid."""
    out: set[int] = set()
    for cfg in _configs(config):
        for key, value in vars(cfg).items():
            if key.endswith(("_token_id", "_token_index")) and isinstance(value, int):
                out.add(value)
    return out


def _text_ids(length: int, vocab: int, avoid: set[int], seed: int) -> Any:
    """Token ids drawn uniformly from the vocabulary, none of them a special token."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=g)
    safe = next((i for i in range(vocab) if i not in avoid), 0)
    for a in avoid:
        ids[ids == a] = safe
    return ids


def _spec(name: str, t: Any) -> str:
    """A SPEC text for a CPU tensor (shape and dtype), the values given apart."""
    dims = "x".join(str(int(d)) for d in t.shape) or "1"
    dtype = str(t.dtype).removeprefix("torch.")
    if t.is_floating_point():
        return f"{name}={dtype}:{dims}"
    return f"{name}={dtype}:{dims}:0..2"


class _Inputs:
    """The default inputs being put together: SPEC texts plus exact values by name."""

    def __init__(self) -> None:
        self.specs: list[str] = []
        self.values: dict[str, Any] = {}
        self.names: set[str] = set()

    def add(self, name: str, spec: str, value: Any = None) -> None:
        if name in self.names:
            return
        self.names.add(name)
        self.specs.append(spec)
        if value is not None:
            self.values[name] = value

    def tensor(self, name: str, value: Any) -> None:
        self.add(name, _spec(name, value), value)

    def rename(self, old: str, new: str) -> None:
        if old not in self.names or new in self.names:
            return
        self.names = {new if n == old else n for n in self.names}
        self.specs = [new + s[len(old) :] if s.startswith(f"{old}=") else s for s in self.specs]
        if old in self.values:
            self.values[new] = self.values.pop(old)


REGIONS = 36  # region features per image (the usual Faster R-CNN count)


def _text_extras(config: Any, params: list[str], out: _Inputs) -> None:
    """What text models read beside the ids, from their config: region features
    (``visual_feats``/``visual_embeds``/``visual_pos``, ``REGIONS`` of them, as wide as
    ``visual_feat_dim``/``visual_embedding_dim``/``visual_pos_dim`` say; ``lxmert``,
    ``visual_bert``), a box per token (``bbox``) and the language of a model whose
    config lists ``languages`` (``lang_ids``: the first)."""
    import torch

    for name in ("visual_feats", "visual_embeds", "visual_pos"):
        if name not in params:
            continue
        stem = name.removesuffix("s")
        dim = _get(config, f"{name}_dim", f"{stem}_dim", f"{stem}ding_dim")
        if isinstance(dim, int) and dim > 0:
            g = torch.Generator().manual_seed(2)
            out.tensor(name, torch.rand((1, REGIONS, dim), generator=g))
    ids = out.values.get("input_ids")
    if "bbox" in params and isinstance(ids, torch.Tensor):
        # document layout models: a box per token, all zeros, as layoutlm's forward makes
        # when none is given (``udop``'s encoder has no such default)
        out.tensor("bbox", torch.zeros((*ids.shape, 4), dtype=torch.int64))
    languages = _get(config, "languages")
    if "lang_ids" in params and isinstance(languages, (list, tuple)) and languages:
        out.tensor("lang_ids", torch.zeros((1,), dtype=torch.int64))


def _takes_tensor(module: Any, name: str) -> bool:
    """Whether forward's parameter ``name`` may be a tensor (unannotated, or annotated
    with a type that names one)."""
    try:
        param = inspect.signature(module.forward).parameters.get(name)
    except (TypeError, ValueError):
        return True
    if param is None or param.annotation is inspect.Parameter.empty:
        return True
    text = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    return "Tensor" in text or "Any" in text


def _required(module: Any, name: str) -> bool:
    """Whether forward's parameter ``name`` has no default."""
    try:
        param = inspect.signature(module.forward).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def _series(module: Any, config: Any, params: list[str], out: _Inputs) -> None:
    """A time series model (``past_values``): ``context_length`` steps of
    ``num_input_channels`` (or ``input_size``) values, all observed. A model whose config
    names no channels but patches (``patch_length``: ``timesfm``) takes one series a
    row, ``batch x steps``, with the padding indicator (zeros) and the frequency index
    (0) where forward requires them."""
    import torch

    steps = _get(config, "context_length")
    channels = _get(config, "num_input_channels", "input_size")
    if not isinstance(steps, int) or steps <= 0:
        return
    if channels is None and isinstance(_get(config, "patch_length"), int):
        out.add("past_values", f"past_values=float32:1x{steps}")
        if _required(module, "past_values_padding"):
            out.tensor("past_values_padding", torch.zeros((1, steps), dtype=torch.int64))
        if _required(module, "freq"):
            out.tensor("freq", torch.zeros((1,), dtype=torch.int64))
        return
    channels = channels if isinstance(channels, int) and channels > 0 else 1
    out.add("past_values", f"past_values=float32:1x{steps}x{channels}")
    for mask in ("observed_mask", "past_observed_mask"):
        if mask in params:
            out.tensor(mask, torch.ones((1, steps, channels)))


def default_inputs(module: Any, config: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Forward's main inputs from transformers' own hints, one rule per family.

    Returns SPEC texts and, by name, exact CPU values where values matter (token ids
    carrying image tokens, decoder start ids, feature masks, ``image_grid_thw``).
    The families, chosen from ``main_input_name``, forward's parameters and config fields:
    text (``input_ids``), vision (``pixel_values``; 5-D with ``num_frames`` for video;
    ``pixel_mask`` for detection), audio (``input_values``, or the features transformers'
    default feature extractor makes from one second of audio), speech and text seq2seq
    (``decoder_input_ids`` starting with ``decoder_start_token_id``), and multimodal
    (``pixel_values`` and extras from the default image processor, ``input_ids``
    carrying as many image tokens as ``get_image_features`` returns features).
    """
    params = _params(module)
    if not params:
        return (), {}
    main = getattr(module, "main_input_name", None)
    named = main  # what transformers calls the main input, also where forward does not
    if main not in params:
        main = params[0]
    out = _Inputs()
    if _without_prenet(module) and isinstance(_get(config, "hidden_size"), int):
        # a speech encoder-decoder built without its prenets (``speecht5``'s base model):
        # it reads hidden states of its width, in and out
        hidden = _get(config, "hidden_size")
        for name in ("input_values", "decoder_input_values"):
            if name in params:
                out.add(name, f"{name}=float32:1x{DEFAULT_TEXT_LENGTH}x{hidden}")
        return tuple(out.specs), out.values
    projected = _get(config, "feature_projection_input_dim")
    if main == "input_features" and isinstance(projected, int) and projected > 1:
        # stacked filterbank frames as wide as the feature projection takes
        # (``wav2vec2-bert``: 80 mel bins, two frames a step)
        out.add(main, f"{main}=float32:1x{DEFAULT_TEXT_LENGTH}x{projected}")
        return tuple(out.specs), out.values
    if named in _AUDIO_INPUTS and named != main and main not in ("input_ids", "inputs_embeds"):
        # forward names its audio otherwise (``hidden_states``): the audio rule, renamed
        _audio(config, params, named, out)
        out.rename(named, main)
        _latents(module, config, main, out)
        return tuple(out.specs), out.values
    if main == "past_values":
        _series(module, config, params, out)
        return tuple(out.specs), out.values
    if main == "pixel_values_videos":  # a video tower: frames x channels x height x width
        frames = _get(config, "num_frames")
        frames = frames if isinstance(frames, int) and frames > 0 else DEFAULT_FRAMES
        height, width = _image_size(config)
        dims = f"1x{frames}x{_channels(config)}x{height}x{width}"
        out.add(main, f"{main}=float32:{dims}")
        return tuple(out.specs), out.values
    width = _get(config, "d_model", "hidden_size")
    if main in ("inputs", "inputs_embeds") and "input_ids" not in params and isinstance(width, int):
        # embeddings in (``perceiver`` without a preprocessor): tokens of the model's width
        out.add(main, f"{main}=float32:1x{DEFAULT_TEXT_LENGTH}x{width}")
        return tuple(out.specs), out.values
    if main == "latents" and isinstance(width, int):
        # an audio codec's decoder (``mimi_decoder``): ``hidden_size`` channels of
        # continuous latents, one second of frames at the config's frame rate
        rate = _get(config, "frame_rate")
        frames = max(1, round(rate)) if isinstance(rate, (int, float)) and rate > 0 else 16
        out.add(main, f"{main}=float32:1x{width}x{frames}")
        return tuple(out.specs), out.values
    if main == "states" and "actions" in params:
        _trajectory(config, params, out)
        return tuple(out.specs), out.values
    if main == "noise_embeds" and "context_hidden_states" in params and isinstance(width, int):
        _draft(module, config, width, out)
        return tuple(out.specs), out.values
    if main == "query_embeds" and isinstance(width, int):
        _queries(config, params, width, out)
        return tuple(out.specs), out.values
    vocab = _get(config, "vocab_size")
    avoid = _special_ids(config)
    if vocab is None and isinstance(_get(config, "num_hash_buckets"), int):
        # a character model (``canine``): Unicode code points, below its special ones
        # (private-use code points, 0xE000 and up)
        vocab = min((i for i in avoid if i > 0), default=0xE000)
    length = DEFAULT_TEXT_LENGTH
    limit = _get(config, "max_position_embeddings", "n_positions", "max_length")
    if isinstance(limit, int) and 0 < limit < length:
        length = limit

    vision = "pixel_values" in params and (main == "pixel_values" or _has_vision(config))
    if "grid_thw" in params and params[0] != "input_ids":
        _patch_grid(module, config, params, out)
    elif vision:
        _vision(module, config, params, out)
    if main in _AUDIO_INPUTS:
        _audio(config, params, main, out)
    audio_names: set[str] = set()
    if main not in _AUDIO_INPUTS and (
        getattr(config, "audio_config", None) is not None
        or _processor_class(config, "audio") is not None
    ):
        # a second modality: the audio tower's input where forward takes it (``clap``;
        # ``clvp``, whose type has a feature extractor)
        second = next((p for p in params if p in _AUDIO_INPUTS), None)
        merges = any(hasattr(config, k) for k in ("audio_token_id", "audio_token_index"))
        if merges and _get(config, "audio_token_id", "audio_token_index") is None:
            second = None  # its text would carry audio tokens, and the config names none
        if second is not None:
            before = set(out.names)
            _audio(config, params, second, out, second=True)
            audio_names = out.names - before
    # before the text: the image features may read them (``qformer_input_ids``)
    _token_arguments(module, config, params, length, out)
    text = "input_ids" in params and isinstance(vocab, int) and vocab > 0
    if text and (
        main == "input_ids"
        or getattr(config, "is_encoder_decoder", False)
        or _required(module, "input_ids")
        or ("pixel_values" in out.names and getattr(config, "text_config", None) is not None)
    ):
        ids = _text_ids(length, vocab, avoid, 0)
        ids = _with_codebooks(module, config, ids, vocab)
        image_token = _get(config, "image_token_id", "image_token_index")
        if "pixel_values" in out.names and isinstance(image_token, int):
            count = _image_tokens(module, out)
            if count is None:  # the vision part cannot say: text alone
                for key in [k for k in out.names if k != "input_ids"]:
                    out.names.discard(key)
                    out.values.pop(key, None)
                out.specs = []
            else:
                import torch

                image = torch.full((1, count), image_token, dtype=torch.int64)
                ids = torch.cat([ids[:, :1], image, ids[:, 1:]], dim=1)
        audio_token = _get(config, "audio_token_id", "audio_token_index")
        audio_key = next((k for k in _AUDIO_INPUTS if k in audio_names), None)
        if audio_key is not None and isinstance(audio_token, int):
            # the same for audio: as many audio tokens as get_audio_features returns
            count = _image_tokens(module, out, "get_audio_features", audio_key)
            fixed = _get(config, "audio_soft_tokens_per_image")
            if count is not None and isinstance(fixed, int) and fixed > count:
                count = fixed  # forward pads the features to this many (``gemma3n``)
            if count is None:  # the audio part cannot say: without audio
                for key in audio_names:
                    out.names.discard(key)
                    out.values.pop(key, None)
                out.specs = [s for s in out.specs if s.split("=", 1)[0] not in audio_names]
            else:
                import torch

                audio = torch.full((1, count), audio_token, dtype=torch.int64)
                ids = torch.cat([ids[:, :1], audio, ids[:, 1:]], dim=1)
        if "pixel_values" in out.names and image_token is None and "mm_token_type_ids" in params:
            # forward places images by their tokens' type (``mm_token_type_ids``), and the
            # config names no image token to carry them (``minicpmv4_7``): text alone
            keep = set(audio_names)
            for key in [k for k in out.names if k not in keep]:
                out.names.discard(key)
                out.values.pop(key, None)
            out.specs = [s for s in out.specs if s.split("=", 1)[0] in keep]
        if "pixel_values" in out.names and not isinstance(image_token, int):
            ids = _image_positions(module, params, ids, out)
        out.tensor("input_ids", ids)
        if "attention_mask" in params:
            out.tensor("attention_mask", ids.new_ones(ids.shape[:2]))
        if "mm_token_type_ids" in params and isinstance(image_token, int):
            # the processor's modality label per token: 0 text, 1 image, 2 video
            out.tensor("mm_token_type_ids", (ids == image_token).to(ids.dtype))
    if "pixel_values_videos" in params and "pixel_values_videos" not in out.names:
        video = getattr(config, "video_config", None)
        if _required(module, "pixel_values_videos") or (
            video is not None and not isinstance(video, (dict, str, bool, int))
        ):
            # a video beside the text or the audio (``pe_video``, ``pe_audio_video``)
            frames = _get(config, "num_frames")
            frames = frames if isinstance(frames, int) and frames > 0 else DEFAULT_FRAMES
            height, width = _image_size(config)
            dims = f"1x{frames}x{_channels(config)}x{height}x{width}"
            out.add("pixel_values_videos", f"pixel_values_videos=float32:{dims}")
    if "input_ids" in out.names:
        _text_extras(config, params, out)
        ids = out.values["input_ids"]
        if "image_attention_mask" in params and "pixel_values" in out.names:
            import torch

            # every text token sees the one image
            out.tensor("image_attention_mask", torch.ones((*ids.shape[:2], 1), dtype=torch.int64))
    if "decoder_input_ids" in params and (
        getattr(config, "is_encoder_decoder", False) or main != "input_ids"
    ):
        # the decoder's own sub-config first (``dia``: its audio codes, not the text's bytes)
        dec_cfg = getattr(config, "decoder_config", None)
        dec_cfg = dec_cfg if dec_cfg is not None and not isinstance(dec_cfg, dict) else None
        dec_vocab = _get(config, "decoder_vocab_size") or getattr(dec_cfg, "vocab_size", None)
        dec_vocab = dec_vocab or _get(config, "vocab_size")
        start = _get(config, "decoder_start_token_id", "bos_token_id")
        # a decoder of parallel codebooks: ``batch x steps x codebooks`` ids (``dia``'s
        # forward also names ``batch * codebooks x steps``, which its embedding's view
        # refuses after forward's own transpose, on the CPU too)
        books = getattr(dec_cfg, "num_codebooks", None) or getattr(dec_cfg, "num_channels", None)
        books = books if isinstance(books, int) and books > 0 else 1
        if isinstance(dec_vocab, int) and dec_vocab > 0:
            dec_len = length
            dec_limit = _get(config, "max_target_positions")
            if isinstance(dec_limit, int) and 0 < dec_limit < dec_len:
                dec_len = dec_limit
            dec = _text_ids(dec_len * books, dec_vocab, avoid, 1).view(1, dec_len, books)
            if isinstance(start, int) and 0 <= start < dec_vocab:
                dec[0, 0] = start
            if books == 1:
                dec = dec.view(1, dec_len)
            out.tensor("decoder_input_ids", dec)
    if not out.specs and not _takes_tensor(module, main):
        # forward's first input is an object (an inference session), not an image
        return (), {}
    if not out.specs and _has_vision(config) and main not in ("input_ids", "inputs_embeds"):
        # a vision model whose forward names its image otherwise (``input``, ``x``):
        # one config-sized image, positional
        height, width = _image_size(config)
        channels = _channels(config)
        out.add(main, f"1x{channels}x{height}x{width}")
    elif not out.specs and params[0] not in ("input_ids", "inputs_embeds") and _has_vision(config):
        height, width = _image_size(config)
        out.add(params[0], f"1x{_channels(config)}x{height}x{width}")
    return tuple(out.specs), out.values


_AUDIO_INPUTS = ("input_features", "input_values", "audio_mel", "input_audio_embeds")


def _trajectory(config: Any, params: list[str], out: _Inputs) -> None:
    """A trajectory model (``decision_transformer``): states, actions, rewards and returns
    to go for ``DEFAULT_TEXT_LENGTH`` steps (fewer where three tokens a step would pass
    ``n_positions``), ``state_dim`` and ``act_dim`` wide, the steps' time indices below
    ``max_ep_len``, and an all-ones mask."""
    import torch

    states, actions = _get(config, "state_dim"), _get(config, "act_dim")
    if not (isinstance(states, int) and isinstance(actions, int)):
        return
    steps = DEFAULT_TEXT_LENGTH
    limit = _get(config, "n_positions", "max_position_embeddings")
    if isinstance(limit, int) and limit >= 3:
        steps = min(steps, limit // 3)
    episode = _get(config, "max_ep_len")
    if isinstance(episode, int) and episode > 0:
        steps = min(steps, episode)
    for name, width in (("states", states), ("actions", actions)):
        out.add(name, f"{name}=float32:1x{steps}x{width}")
    for name in ("rewards", "returns_to_go"):
        if name in params:
            out.add(name, f"{name}=float32:1x{steps}x1")
    if "timesteps" in params:
        out.tensor("timesteps", torch.arange(steps, dtype=torch.int64).unsqueeze(0))
    if "attention_mask" in params:
        out.tensor("attention_mask", torch.ones((1, steps), dtype=torch.int64))


def _draft(module: Any, config: Any, width: int, out: _Inputs) -> None:
    """A block-diffusion draft model (``muse_glimmer_assistant``): ``block_size`` noise
    embeddings of the model's width, and the target model's hidden states as context,
    ``DEFAULT_TEXT_LENGTH`` of them, as wide as the context projection takes (the first
    ``Linear`` of its ``encoder``)."""
    import torch

    block = _get(config, "block_size")
    block = block if isinstance(block, int) and block > 0 else DEFAULT_TEXT_LENGTH
    encoder = getattr(module, "encoder", None)
    proj = (
        next((m for m in encoder.modules() if isinstance(m, torch.nn.Linear)), None)
        if isinstance(encoder, torch.nn.Module)
        else None
    )
    if proj is None:
        return
    out.add("noise_embeds", f"noise_embeds=float32:1x{block}x{width}")
    dims = f"1x{DEFAULT_TEXT_LENGTH}x{proj.in_features}"
    out.add("context_hidden_states", f"context_hidden_states=float32:{dims}")


QUERIES = 32  # query tokens of a Q-Former whose config does not say (BLIP-2's default)


def _queries(config: Any, params: list[str], width: int, out: _Inputs) -> None:
    """A Q-Former (``blip_2_qformer``): ``num_query_tokens`` query embeddings of the
    model's width, and the image features its cross-attention reads
    (``encoder_hidden_states``, ``encoder_hidden_size`` wide, ``DEFAULT_TEXT_LENGTH`` of
    them) where forward takes them."""
    queries = _get(config, "num_query_tokens")
    queries = queries if isinstance(queries, int) and queries > 0 else QUERIES
    out.add("query_embeds", f"query_embeds=float32:1x{queries}x{width}")
    enc = _get(config, "encoder_hidden_size")
    if "encoder_hidden_states" in params and isinstance(enc, int) and enc > 0:
        dims = f"1x{DEFAULT_TEXT_LENGTH}x{enc}"
        out.add("encoder_hidden_states", f"encoder_hidden_states=float32:{dims}")


def _latents(module: Any, config: Any, main: str, out: _Inputs) -> None:
    """An audio decoder whose forward names its input otherwise (``hidden_states``) and
    whose first convolution takes more channels than the audio has
    (``vibevoice_acoustic_tokenizer_decoder``): it decodes latents, not audio. They are
    ``1 x in_channels x frames``, one frame per hop of the audio (the product of the
    config's ``upsampling_ratios``)."""
    import torch

    conv = next((m for m in module.modules() if isinstance(m, torch.nn.Conv1d)), None)
    spec = next((s for s in out.specs if s.startswith(f"{main}=")), None)
    if conv is None or spec is None:
        return
    dims = [int(d) for d in spec.split("=", 1)[1].split(":")[-1].split("x") if d.isdigit()]
    if len(dims) != 3 or dims[1] == conv.in_channels:
        return
    hop = 1
    for ratio in _get(config, "upsampling_ratios") or ():
        hop *= ratio if isinstance(ratio, int) and ratio > 0 else 1
    frames = max(1, dims[2] // hop)
    out.specs.remove(spec)
    out.values.pop(main, None)
    out.specs.append(f"{main}=float32:1x{conv.in_channels}x{frames}")


def _without_prenet(module: Any) -> bool:
    """Whether the model's encoder is built without its prenet (speecht5's base model:
    ``SpeechT5EncoderWithoutPrenet``), so it takes hidden states, not audio or text."""
    encoder = getattr(module, "encoder", None)
    return type(encoder).__name__.endswith("WithoutPrenet")


def _with_codebooks(module: Any, config: Any, ids: Any, vocab: int) -> Any:
    """Text and audio codebooks in one id tensor (``kyutai_speech_to_text``): where the
    config has ``num_codebooks`` and ``codebook_vocab_size`` and the model embeds text and
    every codebook in one table (``vocab_size + num_codebooks * codebook_vocab_size`` rows,
    and a padding row), ``batch x steps x (1 + num_codebooks)`` ids: the text's, then a
    code below ``codebook_vocab_size`` per codebook. Else ``ids`` as they are."""
    import torch

    books = _get(config, "num_codebooks")
    codes = _get(config, "codebook_vocab_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (books, codes)):
        return ids
    rows = vocab + books * codes
    tables = (m for m in module.modules() if isinstance(m, torch.nn.Embedding))
    if not any(t.num_embeddings in (rows, rows + 1) for t in tables):
        return ids
    steps = ids.shape[1]
    audio = _text_ids(steps * books, codes, set(), 3).view(1, steps, books)
    return torch.cat([ids.unsqueeze(-1), audio], dim=-1)


def _image_positions(module: Any, params: list[str], ids: Any, out: _Inputs) -> Any:
    """A model that marks where image embeddings go by a mask over the text, not by an
    image token (``kosmos-2``'s ``image_embeds_position_mask``): the text gets as many
    positions as ``get_image_features`` returns features, after the first token, and
    the mask is one there. Without a count, the image is left out."""
    import torch

    name = next((p for p in params if "image" in p and p.endswith("position_mask")), None)
    if name is None:
        return ids
    count = _image_tokens(module, out)
    if count is None:
        return ids
    slots = ids[:, 1 : 1 + count]
    while slots.shape[1] < count:
        slots = torch.cat([slots, ids[:, 1 : 1 + count - slots.shape[1]]], dim=1)
    ids = torch.cat([ids[:, :1], slots, ids[:, 1:]], dim=1)
    mask = torch.zeros(ids.shape, dtype=torch.int64)
    mask[:, 1 : 1 + count] = 1
    out.tensor(name, mask)
    return ids


def _token_arguments(
    module: Any, config: Any, params: list[str], length: int, out: _Inputs
) -> None:
    """Required token arguments beside the main ones (``qformer_input_ids``,
    ``oneformer``'s ``task_inputs``): token ids, ``PREFIX_seq_len`` long where the config
    says (else as long as the text), from ``PREFIX_config``'s ``vocab_size`` or
    ``PREFIX_vocab_size`` (else the first ``*vocab_size`` of the config); and their
    ``PREFIX_attention_mask`` where forward takes one, all ones."""
    import torch

    for name in params:
        if name in out.names or not name.endswith(("_input_ids", "_inputs")):
            continue
        if not _required(module, name) or not _takes_tensor(module, name):
            continue
        prefix = name.removesuffix("_input_ids").removesuffix("_inputs")
        sub = getattr(config, f"{prefix}_config", None)
        vocab = getattr(sub, "vocab_size", None) or getattr(config, f"{prefix}_vocab_size", None)
        if not isinstance(vocab, int):
            vocab = next(
                (
                    v
                    for k, v in vars(config).items()
                    if k.endswith("vocab_size") and isinstance(v, int)
                ),
                None,
            )
        if not isinstance(vocab, int) or vocab <= 0:
            continue
        steps = getattr(config, f"{prefix}_seq_len", None)
        steps = steps if isinstance(steps, int) and steps > 0 else length
        ids = _text_ids(steps, vocab, _special_ids(config), 2)
        out.tensor(name, ids)
        if f"{prefix}_attention_mask" in params:
            out.tensor(f"{prefix}_attention_mask", torch.ones_like(ids))


def _patch_grid(module: Any, config: Any, params: list[str], out: _Inputs) -> None:
    """A vision tower that takes its image as flat patches plus their grid (``grid_thw``:
    frames, rows, columns in patches), as the image processor's ``pixel_values`` and
    ``image_grid_thw``: one config-sized image cut into ``patch_size`` patches,
    ``temporal_patch_size`` frames deep, rows and columns a multiple of
    ``spatial_merge_size``. The default image processor's output is used where its
    patches have the config's width; else the patches are drawn to the config."""
    import torch

    patch = _get(config, "patch_size")
    if not isinstance(patch, int) or patch <= 0:
        return
    frames = _get(config, "temporal_patch_size", "patch_temporal")
    frames = frames if isinstance(frames, int) and frames > 0 else 1
    merge = _get(config, "spatial_merge_size", "merge_size")
    merge = merge if isinstance(merge, int) and merge > 0 else 1
    channels = _get(config, "in_channels", "num_channels", "in_chans")
    channels = channels if isinstance(channels, int) and 0 < channels <= 16 else 3
    width = channels * frames * patch * patch
    height_px, width_px = _image_size(config)
    first = params[0]
    processed = _processed_image(config, height_px, width_px, channels)
    pixels, grid = processed.get("pixel_values"), processed.get("image_grid_thw")
    if (
        isinstance(pixels, torch.Tensor)
        and isinstance(grid, torch.Tensor)
        and pixels.dim() == 2
        and pixels.shape[-1] == width
        and grid.shape[-1] == 3
        and int(grid.prod(-1).sum()) == pixels.shape[0]
    ):
        if _patch_conv(module, patch, frames):
            pixels = pixels.reshape(-1, channels, patch, patch)
        out.add(first, _spec(first, pixels))
        out.tensor("grid_thw", grid.to(torch.int64))
        return
    rows = max(merge, height_px // patch // merge * merge)
    cols = max(merge, width_px // patch // merge * merge)
    dims = f"{rows * cols}x{width}"
    if _patch_conv(module, patch, frames):
        dims = f"{rows * cols}x{channels}x{patch}x{patch}"
    out.add(first, f"{first}=float32:{dims}")
    out.tensor("grid_thw", torch.tensor([[1, rows, cols]], dtype=torch.int64))


def _patch_conv(module: Any, patch: int, frames: int) -> bool:
    """Whether the tower embeds patches whole with a 2-D convolution as wide as a patch
    (``kimi_k25_vision``: ``self.proj(pixel_values)`` on ``patches x channels x patch x
    patch``), rather than taking flat patches and reshaping them itself (qwen2-vl's 3-D
    convolution, hunyuan-vl's ``pixel_values.reshape`` first): the patch embedding's
    forward hands its input to the convolution on the first line that reads it."""
    import torch

    if frames != 1:
        return False
    for parent in module.modules():
        for name, conv in parent.named_children():
            if not isinstance(conv, torch.nn.Conv2d):
                continue
            if tuple(conv.kernel_size) != (patch, patch) or tuple(conv.stride) != (patch, patch):
                return False
            return _hands_to(type(parent).forward, name)
    return False


def _hands_to(forward: Any, attr: str) -> bool:
    """Whether the first statement of ``forward`` that reads its first argument passes it
    to ``self.ATTR(...)`` as it is."""
    import ast
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(forward))
        tree = ast.parse(source).body[0]
        first = list(inspect.signature(forward).parameters)[1]
    except (OSError, TypeError, ValueError, IndexError, SyntaxError):
        return False
    if not isinstance(tree, ast.FunctionDef):
        return False
    for stmt in tree.body:
        names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        if first not in names:
            continue
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            fn = call.func
            if (
                isinstance(fn, ast.Attribute)
                and fn.attr == attr
                and isinstance(fn.value, ast.Name)
                and fn.value.id == "self"
                and any(isinstance(a, ast.Name) and a.id == first for a in call.args[:1])
            ):
                return True
        return False
    return False


def _channels(config: Any) -> int:
    channels = _get(config, "num_channels", "in_channels", "in_chans")
    return channels if isinstance(channels, int) and 0 < channels <= 16 else 3


def _has_vision(config: Any) -> bool:
    return any(
        getattr(config, k, None) is not None
        for k in ("vision_config", "image_size", "num_channels", "in_channels")
    )


def _vision(module: Any, config: Any, params: list[str], out: _Inputs) -> None:
    """pixel_values (and the extras the default image processor makes, where forward
    takes them), else a config-sized image; 5-D for video, pixel_mask for detection."""
    import torch

    height, width = _image_size(config)
    channels = _get(config, "num_channels", "in_channels", "in_chans")
    channels = channels if isinstance(channels, int) and 0 < channels <= 16 else 3
    processed = _processed_image(config, height, width, channels, params)
    processed = _renamed(processed, params)
    extras = {k: v for k, v in processed.items() if k in params and k != "pixel_values"}
    fitted = _window_fit(config, processed.get("pixel_values"))
    if fitted is not None:
        # the processor's size does not split into the backbone's windows: the largest
        # size below it that does
        processed, extras = {}, {}
        height, width = fitted
    if extras and "pixel_values" in processed:
        out.tensor("pixel_values", processed["pixel_values"])
        for key, value in extras.items():
            if isinstance(value, torch.Tensor):
                out.tensor(key, value)
        return
    pixels = processed.get("pixel_values")
    if processed.get("pair") and isinstance(pixels, torch.Tensor):
        # two images of one scene, stacked as the processor stacks them (dim 1)
        out.tensor("pixel_values", pixels)
        return
    if (
        _get(config, *_SIZE_KEYS) is None
        and isinstance(pixels, torch.Tensor)
        and pixels.dim() == 4
        and pixels.shape[1] == channels
    ):  # no size in the config: the size the default image processor resizes to
        height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    frames = _get(config, "num_frames")
    video = "video" in type(module).__name__.lower() + str(getattr(config, "model_type", ""))
    if frames is None and video and getattr(module, "main_input_name", None) == "pixel_values":
        frames = DEFAULT_FRAMES  # a video model whose config says no count (instructblipvideo)
    vision_frames = getattr(getattr(config, "vision_config", None), "num_frames", None)
    if (
        isinstance(frames, int)
        and frames > 0
        # its own config's count, or its vision tower's (``xclip``)
        and (video or frames in (getattr(config, "num_frames", None), vision_frames))
    ):
        out.add("pixel_values", f"pixel_values=1x{frames}x{channels}x{height}x{width}")
    elif "image_attention_mask" in params:
        # images per text, each text token told which it sees (idefics): one image
        out.add("pixel_values", f"pixel_values=1x1x{channels}x{height}x{width}")
    else:
        out.add("pixel_values", f"pixel_values=1x{channels}x{height}x{width}")
    if "pixel_mask" in params:
        out.tensor("pixel_mask", torch.ones((1, height, width), dtype=torch.int64))


def _renamed(processed: dict[str, Any], params: list[str]) -> dict[str, Any]:
    """The processor's ``image_*`` outputs under forward's ``pixel_*`` names, where forward
    takes only those (gemma4's ``image_position_ids`` is forward's ``pixel_position_ids``)."""
    out = dict(processed)
    for key in processed:
        alias = "pixel_" + key.removeprefix("image_")
        if key.startswith("image_") and key not in params and alias in params:
            out[alias] = out.pop(key)
    return out


def _window_fit(config: Any, pixels: Any) -> tuple[int, int] | None:
    """For an image that does not split into the windows of a windowed ViT backbone
    (``num_windows_side`` windows a side, ``lw_detr``; ``num_windows`` a side where the
    config has no ``num_windows_side``, ``rf_detr``; each a whole number of ``patch_size``
    patches), the largest (height, width) at most its size that does; None where the
    image splits, the config has no such backbone, or there is no image."""
    import torch

    if not isinstance(pixels, torch.Tensor) or pixels.dim() < 2:
        return None
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    for cfg in _configs(config):
        patch = getattr(cfg, "patch_size", None)
        side = getattr(cfg, "num_windows_side", None) or getattr(cfg, "num_windows", None)
        if not (isinstance(patch, int) and isinstance(side, int) and patch > 0 and side > 0):
            continue
        unit = patch * side
        if height % unit or width % unit:
            return max(unit, height // unit * unit), max(unit, width // unit * unit)
    return None


def _processed_image(
    config: Any, height: int, width: int, channels: int, params: list[str] | None = None
) -> dict[str, Any]:
    """What transformers' default image processor for this type makes of one image; where
    forward takes further images (``PREFIX_pixel_values``) and the processor an argument
    for them (``PREFIX_images``, and ``PREFIX_masks``: ``seggpt``'s prompt), the same
    image again and an all-ones mask. A processor that takes pairs of images only
    (keypoint matching) gets the image twice, and the result says ``pair``."""
    cls = _processor_class(config, "image")
    if cls is None:
        return {}
    try:
        import numpy as np

        image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
        with _quiet():
            processor = cls()
            # the patching the config's model expects, where the processor patches too
            fit = {}
            for ours, theirs in _PATCHING:
                want = _get(config, ours)
                have = getattr(processor, theirs, None)
                if isinstance(want, int) and isinstance(have, int) and want != have:
                    fit[theirs] = want
            if fit:
                processor = cls(**fit)
            more: dict[str, Any] = {}
            takes = _params_of(getattr(processor, "preprocess", None))
            for name in params or ():
                prefix = name.removesuffix("_pixel_values")
                if name == prefix or name == "pixel_values" or f"{prefix}_images" not in takes:
                    continue
                more[f"{prefix}_images"] = [image]
                if f"{prefix}_masks" in takes:
                    more[f"{prefix}_masks"] = [np.ones((height, width), dtype=np.uint8)]
            try:
                got = processor(images=[image], **more, return_tensors="pt")
            except ValueError:  # a processor of image pairs (keypoint matching)
                got = processor(images=[[image, image]], **more, return_tensors="pt")
                return {**dict(got), "pair": True}
        return dict(got)
    except Exception:
        return {}


# config field -> the image processor's attribute for the same patching
_PATCHING = (
    ("patch_size", "patch_size"),
    ("spatial_merge_size", "merge_size"),
    ("temporal_patch_size", "temporal_patch_size"),
)


def _audio(config: Any, params: list[str], main: str, out: _Inputs, second: bool = False) -> None:
    """One second of audio through transformers' default feature extractor for this type,
    which also gives raw audio its channel dimension (``dac``: ``1 x 1 x rate``); else
    raw audio ``1 x rate`` (``1 x audio_channels x rate`` where the config has channels),
    or ``num_mel_bins`` x twice ``max_source_positions`` features."""
    import torch

    cls = _processor_class(config, "audio")
    if cls is not None:
        try:
            import numpy as np

            fe = cls()
            bins = _get(config, "num_mel_bins", "n_mels")
            have = getattr(fe, "feature_size", None)
            if isinstance(bins, int) and isinstance(have, int) and have > 1 and bins != have:
                fe = cls(feature_size=bins)  # as many mel bins as the model's config says
            rate = int(getattr(fe, "sampling_rate", 16000) or 16000)
            wave = np.random.default_rng(0).standard_normal(rate).astype(np.float32) * 0.1
            # the mask too, where forward takes one (``input_features_mask``)
            mask = any(p.startswith(main) and "mask" in p for p in params)
            with _quiet():
                options = {"sampling_rate": rate, "return_tensors": "pt"}
                try:
                    got = _extract(fe, wave, options, mask)
                except Exception:  # an extractor of batches only, with its mask (gemma4's)
                    got = _extract(fe, [wave], options, True)
            names = list(getattr(fe, "model_input_names", []) or got)
        except Exception:  # also a class whose backend is missing (torchaudio)
            got, names = {}, []
        first = names[0] if names else None
        for key, value in got.items():
            if not isinstance(value, torch.Tensor):
                continue
            target = key if key in params and not (second and key == "attention_mask") else None
            if target is None and key == first:
                target = main
            elif target is None and "mask" in key:
                target = next((p for p in params if p.startswith(main) and "mask" in p), None)
                if not second:  # beside text, attention_mask is the text's
                    target = target or ("attention_mask" if "attention_mask" in params else None)
            if target is not None:
                out.tensor(target, value)
        if main in out.names:
            return
    if main == "input_values":
        rate = _get(config, "sampling_rate") or 16000
        channels = _get(config, "audio_channels")
        dims = f"1x{channels}x{int(rate)}" if isinstance(channels, int) else f"1x{int(rate)}"
        out.add("input_values", f"input_values={dims}")
        return
    bins = _get(config, "num_mel_bins", "feature_size", "input_feat_size", "n_mels")
    frames = _get(config, "max_source_positions")
    if isinstance(bins, int) and isinstance(frames, int):
        out.add(main, f"{main}=1x{bins}x{2 * frames}")


def _extract(fe: Any, wave: Any, options: dict[str, Any], mask: bool) -> dict[str, Any]:
    """The feature extractor's output for ``wave``, with its attention mask where asked."""
    try:
        return dict(fe(wave, **options, return_attention_mask=mask))
    except TypeError:  # an extractor without that option
        return dict(fe(wave, **options))


def _image_tokens(
    module: Any, out: _Inputs, method: str = "get_image_features", key: str = "pixel_values"
) -> int | None:
    """How many image (audio) tokens the text must carry: the features ``method``
    returns for these inputs (run on the model's device; on meta, with value stand-ins)."""
    import torch

    from hookcli.inputs.grammar import meta_with_values
    from hookcli.metavalues import MetaValues

    fn = getattr(module, method, None)
    if fn is None:
        inner = getattr(module, "model", None)
        fn = getattr(inner, method, None)
    if fn is None:
        return None
    try:
        accepted = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    kwargs: dict[str, Any] = {}
    for name in out.names:
        if name not in accepted:
            continue
        value = out.values.get(name)
        if value is None:
            spec = next(s for s in out.specs if s.startswith(f"{name}="))
            dims = [int(d) for d in spec.split("=", 1)[1].split(":")[0].split("x")]
            value = torch.randn(dims) if device.type != "meta" else None
            if value is None:
                kwargs[name] = torch.empty(dims, device="meta")
                continue
        kwargs[name] = meta_with_values(value) if device.type == "meta" else value.to(device)
    if key not in kwargs:
        return None
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    if dtype is not None and kwargs[key].is_floating_point():
        kwargs[key] = kwargs[key].to(dtype)
    try:
        with torch.no_grad(), MetaValues() if device.type == "meta" else contextlib.nullcontext():
            feats = fn(**kwargs)
    except Exception:
        return None
    feats = getattr(feats, "pooler_output", feats) if not isinstance(feats, torch.Tensor) else feats
    tensors = [t for t in _flat(feats) if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not tensors:
        return None
    hidden = tensors[0].shape[-1]
    total = sum(t.numel() for t in tensors)
    return total // hidden if hidden else None


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _flat(o)]
    return [obj]


@contextlib.contextmanager
def _quiet() -> Any:
    """transformers' processors warn about defaults; hookcli's output stays clean."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
