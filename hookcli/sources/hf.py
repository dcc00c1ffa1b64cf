"""``hf:NAME[:HEAD]``: a transformers model built from its config, never downloaded.

NAME is a model type (``llama``, ``gpt2``, ``bert``, ``t5``, ``vit``...), a local
folder holding ``config.json``, or a Hub id whose config is already in the
local Hugging Face cache. ``-k KEY=VALUE`` sets config attributes. HEAD picks a
task head (``HEADS``); the base model (``AutoModel``) without one.
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, UsageError, first_line

if TYPE_CHECKING:
    from hookcli.loading import LoadedModel

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


def _config(tf: Any, name: str, overrides: dict[str, Any]) -> Any:
    mapping = tf.models.auto.configuration_auto.CONFIG_MAPPING
    if name in mapping:
        return tf.AutoConfig.for_model(name, **overrides)
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise LoadError(f"hf:{name} is a folder without config.json")
        try:
            return tf.AutoConfig.from_pretrained(str(folder), local_files_only=True, **overrides)
        except Exception as err:
            raise LoadError(f"cannot read {folder / 'config.json'}: {first_line(err)}") from err
    try:
        return tf.AutoConfig.from_pretrained(name, local_files_only=True, **overrides)
    except Exception as err:
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


def build(name: str, kwargs: dict[str, Any], seed: int) -> LoadedModel:
    """Build ``hf:NAME[:HEAD]`` from its config, seeded, with default inputs from the config."""
    import torch

    from hookcli.loading import LoadedModel

    tf = _transformers()
    model_name, head = _split(name)
    overrides = dict(kwargs)
    overrides.setdefault("use_cache", False)  # no key/value cache in the outputs
    config = _config(tf, model_name, overrides)
    _warn_unknown(config, kwargs)
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
        raise LoadError(f"could not build hf:{name}: {first_line(err)}") from err
    except Exception as err:
        raise LoadError(f"could not build hf:{name}: {first_line(err)}") from err
    if not isinstance(module, torch.nn.Module):
        raise LoadError(f"hf:{name} built a {type(module).__name__}, not an nn.Module")
    return LoadedModel(
        module=module,
        spec=f"hf:{name}",
        default_inputs=default_inputs(module, config),
        input_source="hf config default",
    )


def _get(config: Any, *keys: str) -> Any:
    """The first of ``keys`` set on the config or its text/vision/encoder sub-configs."""
    subs = [config]
    for sub in ("text_config", "vision_config", "encoder", "audio_config"):
        value = getattr(config, sub, None)
        if value is not None and not isinstance(value, (dict, str)):
            subs.append(value)
    for cfg in subs:
        for key in keys:
            value = getattr(cfg, key, None)
            if value is not None:
                return value
    return None


def default_inputs(module: Any, config: Any) -> tuple[str, ...]:
    """SPEC texts for forward's main inputs, from the config (empty: none known)."""
    try:
        params = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return ()
    specs: list[str] = []
    if "input_ids" in params:
        vocab = _get(config, "vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            limit = _get(config, "max_position_embeddings", "n_positions", "max_length")
            length = DEFAULT_TEXT_LENGTH
            if isinstance(limit, int) and 0 < limit < length:
                length = limit
            specs.append(f"input_ids=int64:1x{length}:0..{vocab}")
            if "attention_mask" in params:
                specs.append(f"attention_mask=int64:1x{length}:1..2")
            if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
                specs.append(f"decoder_input_ids=int64:1x{length}:0..{vocab}")
    if "pixel_values" in params:
        size = _get(config, "image_size")
        channels = _get(config, "num_channels") or 3
        if isinstance(size, (list, tuple)) and len(size) == 2:
            specs.append(f"pixel_values=1x{channels}x{size[0]}x{size[1]}")
        elif isinstance(size, int):
            specs.append(f"pixel_values=1x{channels}x{size}x{size}")
    if "input_values" in params and not specs:
        specs.append("input_values=1x16000")  # one second of 16 kHz audio
    if "input_features" in params and not specs:
        bins = _get(config, "num_mel_bins")
        frames = _get(config, "max_source_positions")
        if isinstance(bins, int) and isinstance(frames, int):
            specs.append(f"input_features=1x{bins}x{2 * frames}")
    return tuple(specs)
