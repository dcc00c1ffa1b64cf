"""The training-step peak: hookcli's tracker against the allocator, and PyTorch's MemTracker.

For each model and setting, one steady-state training step (optimizer state made by a
step before; forward, the loss, backward, ``optimizer.step()``,
``zero_grad(set_to_none=True)``), three figures:

- hookcli: the live-bytes tracker's peak (``hookcli.memory.step.track_step``, what
  ``hookcli cost --backward`` reports as the step peak), on the run's device;
- measured: the allocator oracle (``tests/memory_oracle.py``: torch.profiler's memory
  events on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA);
- MemTracker: ``torch.distributed._tools.mem_tracker.MemTracker``'s peak, the model,
  optimizer and inputs given to ``track_external``.

Models: the torchvision classification zoo at batch 2 (224x224), and small-config
transformers built from their configs (no downloads): the language models with their
LM head and their own cross-entropy over the vocabulary as the loss (labels: the input
ids): gpt2, llama, mistral, qwen2, mixtral (``AutoModelForCausalLM``), bert
(``AutoModelForMaskedLM``), t5, whisper (``AutoModelForSeq2SeqLM``,
``AutoModelForSpeechSeq2Seq``); vit and clip (text and image) as base models, the sum
of their outputs as the loss, as for the convnets. Settings: fp32 and bf16 autocast,
Adam and SGD, torch's default optimizer implementation on the device and ``foreach``,
with and without ``torch.utils.checkpoint`` around every block.

``HOOKCLI_BENCH_MEMORY=quick``: a handful of models and settings (minutes on a CPU);
``HOOKCLI_BENCH_MEMORY_ONLY=resnet18,gpt2``: only those models; ``--smoke``: one toy.
Prints each row and the median and worst absolute errors; records them. A case that
raises fails the benchmark (named, exit 1) after the others have run; it is not left
out of the median and worst. The device is CUDA where present (the same code), else the
CPU.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import benchmark, record, smoke  # noqa: E402

VISION = [
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "densenet121",
    "vgg11",
    "convnext_tiny",
    "regnet_y_400mf",
    "shufflenet_v2_x1_0",
    "squeezenet1_0",
    "vit_b_16",
    "swin_t",
]
QUICK_VISION = ["resnet18", "mobilenet_v3_small", "densenet121"]
TEXT = ["gpt2", "llama", "mistral", "qwen2", "mixtral", "bert", "t5", "vit", "whisper", "clip"]
QUICK_TEXT = ["gpt2", "llama", "bert", "t5", "mixtral"]

SMALL = {"vocab_size": 1000}
DECODER = {
    **SMALL,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {**SMALL, "n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 256},
    "llama": DECODER,
    "mistral": DECODER,
    "qwen2": DECODER,
    "mixtral": {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    "bert": {
        **SMALL,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
    },
    "t5": {
        **SMALL,
        **{"d_model": 128, "d_ff": 512, "num_layers": 2, "num_heads": 4, "d_kv": 32},
        **{"pad_token_id": 0, "decoder_start_token_id": 0},  # labels shifted right from it
    },
    "vit": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "image_size": 64,
        "patch_size": 8,
    },
    "whisper": {
        **SMALL,
        "d_model": 128,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 512,
        "decoder_ffn_dim": 512,
        "num_mel_bins": 80,
        "max_source_positions": 64,
        "max_target_positions": 64,
        "pad_token_id": 0,  # the defaults are ids of the real 51865-token vocabulary
        "bos_token_id": 1,
        "eos_token_id": 2,
        "decoder_start_token_id": 3,
    },
}
BATCH, SEQ = 4, 64
# the language models' heads: each computes its cross-entropy over the vocabulary from
# ``labels`` (the causal ones shift them by one)
LM_HEADS = {
    **dict.fromkeys(("gpt2", "llama", "mistral", "qwen2", "mixtral"), "AutoModelForCausalLM"),
    "bert": "AutoModelForMaskedLM",
    "t5": "AutoModelForSeq2SeqLM",
    "whisper": "AutoModelForSpeechSeq2Seq",
}


def _hf(kind: str) -> tuple[Any, dict[str, Any]]:
    """A small-config transformers model of ``kind`` and its keyword inputs (CPU)."""
    import torch
    import transformers
    from transformers import AutoConfig

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (BATCH, SEQ), generator=g)
    if kind == "clip":
        from transformers import CLIPConfig, CLIPModel

        text = {"vocab_size": 1000, "hidden_size": 128, "intermediate_size": 512}
        text |= {"num_hidden_layers": 2, "num_attention_heads": 4}
        vision = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2}
        vision |= {"num_attention_heads": 4, "image_size": 64, "patch_size": 8}
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision))
        pixels = torch.randn(BATCH, 3, 64, 64, generator=g)
        return model, {"input_ids": ids, "pixel_values": pixels}
    config = AutoConfig.for_model(kind, **HF_CONFIGS[kind])
    if hasattr(config, "use_cache"):
        config.use_cache = False
    head = getattr(transformers, LM_HEADS.get(kind, "AutoModel"))
    model = head.from_config(config)
    if kind == "vit":
        return model, {"pixel_values": torch.randn(BATCH, 3, 64, 64, generator=g)}
    if kind == "t5":
        return model, {"input_ids": ids, "labels": ids}
    if kind == "whisper":
        features = torch.randn(BATCH, 80, 128, generator=g)
        return model, {"input_features": features, "labels": ids[:, :32]}
    return model, {"input_ids": ids, "labels": ids}


def _vision(name: str) -> tuple[Any, dict[str, Any]]:
    import torch
    import torchvision.models as tvm

    model = getattr(tvm, name)(num_classes=100)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return model, {"x": x}


def _block(model: Any) -> str | None:
    """The class to checkpoint: that of the first module of the longest ModuleList or
    Sequential of blocks (those holding parameters in modules of their own)."""
    from torch import nn

    best: tuple[int, str] | None = None
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1:
            first = next(iter(m))
            if any(True for _ in first.children()) and (best is None or len(m) > best[0]):
                best = (len(m), type(first).__name__)
    return best[1] if best else None


def _loss(output: Any) -> Any:
    """The model's own loss where it computed one (the LM heads' cross-entropy), else the
    oracle's: the sum of the floating outputs. hookcli's figure and the oracle's step
    both use this."""
    import torch

    from tests.memory_oracle import _loss as oracle_loss

    own = getattr(output, "loss", None)
    return own if isinstance(own, torch.Tensor) else oracle_loss(output)


def _memtracker(step: Any) -> int:
    """MemTracker's peak over one run of ``step`` (an oracle Step), every device summed."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    inputs = [*step.args, *step.kwargs.values()]
    if step.optimizer is not None:
        tracker.track_external(step.model, step.optimizer, *inputs)
    else:
        tracker.track_external(step.model, *inputs)
    with tracker:
        step.run()
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(v.get("Total", 0) for v in peak.values()))


def _case(
    build: Callable[[], tuple[Any, dict[str, Any]]], setting: dict[str, Any], device: str
) -> dict[str, Any]:
    import contextlib

    import torch

    from hookcli.memory.step import track_step
    from tests.memory_oracle import measure_step, steady_step

    torch.manual_seed(0)
    model, kwargs = build()
    model.to(device)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    args: tuple[Any, ...] = ()
    if list(kwargs) == ["x"]:
        args, kwargs = (kwargs["x"],), {}
    amp = torch.bfloat16 if setting.get("amp") else None
    block = _block(model) if setting.get("checkpoint") else None
    if setting.get("checkpoint") and block is None:
        return {"skipped": "no block to checkpoint"}
    kw = {
        "optimizer": setting["optimizer"],
        "foreach": setting.get("foreach"),
        "checkpoint": block,
    }

    def autocast() -> Any:
        return torch.autocast(device, dtype=amp) if amp else contextlib.nullcontext()

    t0 = time.perf_counter()
    predicted = track_step(model, args, kwargs, _loss, forward_context=autocast, **kw)
    t1 = time.perf_counter()
    step = steady_step(model, args, kwargs, amp=amp, loss=_loss, **kw)
    measured = measure_step(step).peak_bytes
    try:
        peer: int | None = _memtracker(step)
    except Exception as err:  # the peer's own failure: shown, not fatal
        print(f"    MemTracker failed: {type(err).__name__}: {err}", flush=True)
        peer = None
    return {
        "predicted": predicted.train.bytes,
        "where": f"{predicted.train.phase} {predicted.train.module}",
        "measured": measured,
        "memtracker": peer,
        "seconds": t1 - t0,
        "checkpoint": block,
    }


def _settings(quick: bool) -> list[dict[str, Any]]:
    base = [
        {"optimizer": "adam"},
        {"optimizer": "sgd"},
        {"optimizer": "adam", "amp": True},
        {"optimizer": "adam", "checkpoint": True},
    ]
    if quick:
        return base
    return [
        *base,
        {"optimizer": "adam", "foreach": True},
        {"optimizer": "sgd", "amp": True, "checkpoint": True},
    ]


def _label(setting: dict[str, Any]) -> str:
    parts = [setting["optimizer"], "bf16" if setting.get("amp") else "fp32"]
    if setting.get("foreach"):
        parts.append("foreach")
    if setting.get("checkpoint"):
        parts.append("ckpt")
    return " ".join(parts)


@benchmark
def main() -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    quick = smoke() or os.environ.get("HOOKCLI_BENCH_MEMORY") == "quick"
    cases: list[tuple[str, Callable[[], tuple[Any, dict[str, Any]]]]] = []
    only = {n.strip() for n in os.environ.get("HOOKCLI_BENCH_MEMORY_ONLY", "").split(",")}
    only.discard("")
    if smoke():
        from tests.fixtures import memory_models

        cases.append(("llama-toy", lambda: (memory_models.llama(), {"x": memory_models.tokens(2)})))
        settings = [{"optimizer": "sgd"}]
    else:
        few = quick and not only  # named models are taken from the whole list
        for name in QUICK_VISION if few else VISION:
            cases.append((name, lambda n=name: _vision(n)))  # type: ignore[misc]
        for kind in QUICK_TEXT if few else TEXT:
            cases.append((f"hf {kind}", lambda k=kind: _hf(k)))  # type: ignore[misc]
        settings = _settings(quick)
        if only:
            cases = [c for c in cases if c[0] in only or c[0].removeprefix("hf ") in only]
    print(f"device: {device}; one steady-state step per row; errors against the allocator")
    mine: list[float] = []
    peers: list[float] = []
    closer = total = 0
    failed: list[str] = []
    for name, build in cases:
        for setting in settings:
            try:
                r = _case(build, setting, device)
            except Exception as err:
                print(f"{name:22s} {_label(setting):22s} FAILED: {type(err).__name__}: {err}")
                failed.append(f"{name} ({_label(setting)})")
                continue
            if "skipped" in r:
                continue
            m = r["measured"]
            e = (r["predicted"] - m) / m
            mine.append(abs(e))
            peer = "-"
            if r["memtracker"] is not None:
                pe = (r["memtracker"] - m) / m
                peers.append(abs(pe))
                peer = f"{r['memtracker'] / 2**20:9.2f} MiB ({pe:+.2%})"
                total += 1
                closer += abs(e) <= abs(pe) + 1e-12
            print(
                f"{name:22s} {_label(setting):22s} measured {m / 2**20:9.2f} MiB | hookcli "
                f"{r['predicted'] / 2**20:9.2f} MiB ({e:+.2%}) at {r['where']} | "
                f"MemTracker {peer}",
                flush=True,
            )
    if failed:
        print(f"FAILED, {len(failed)} of {len(failed) + len(mine)} steps: {', '.join(failed)}")
    if not mine:
        raise SystemExit("bench_memory: no case ran")
    med, worst = statistics.median(mine), max(mine)
    print(f"hookcli: median abs error {med:.2%}, worst {worst:.2%} over {len(mine)} steps")
    record(f"memory_{device}_median_error", 100 * med, what="hookcli step peak", unit="%")
    record(f"memory_{device}_worst_error", 100 * worst, what="hookcli step peak", unit="%")
    if peers:
        pmed, pworst = statistics.median(peers), max(peers)
        print(
            f"MemTracker: median abs error {pmed:.2%}, worst {pworst:.2%}; hookcli at least "
            f"as close on {closer} of {total}"
        )
        record(f"memtracker_{device}_median_error", 100 * pmed, what="MemTracker", unit="%")
        record(f"memtracker_{device}_worst_error", 100 * pworst, what="MemTracker", unit="%")
    if not smoke() and not only:
        _fsdp()
    if failed:  # after every other case: a failed step fails the benchmark, named
        raise SystemExit(f"bench_memory: {len(failed)} steps failed: {', '.join(failed)}")


FSDP_WIDE = '{"vocab": 1000, "dim": 256, "layers": 4, "heads": 8, "kv_heads": 4, "hidden": 688}'
FSDP_CASES = [
    {"world": 2, "optimizer": "adam"},
    {"world": 2, "optimizer": "sgd"},
    {"world": 2, "optimizer": "adamw", "zero_grad": "zeros"},
    {"world": 3, "optimizer": "sgd-momentum"},
    {"world": 4, "optimizer": "adam"},
    {"world": 2, "optimizer": "adam", "checkpoint": "Block", "ids": (4, 64, 1000)},
    {"world": 2, "eval": True},
]


def _fsdp() -> None:
    """One rank's peak under FSDP2 (``cost --fsdp``) against ``fully_shard`` measured
    over torch's fake process group (tests/fsdp_memory_oracle.py), on the CPU: a
    Llama-style decoder of 4 blocks, every rank of each case."""
    from hookcli.distributed.fsdp import cpu_fsdp_supported
    from tests.fixtures.memory_models import fsdp_predicted
    from tests.fsdp_memory_oracle import measured

    if not cpu_fsdp_supported():
        print("FSDP2: this torch cannot run it on the CPU; not measured")
        return
    errors: list[float] = []
    spec = "sample_models.decoder:Decoder"
    for case in FSDP_CASES:
        for rank in range(case["world"]):
            how = {"blocks": "layers", "kwargs": FSDP_WIDE, "ids": (2, 32, 1000), **case}
            how["rank"] = rank
            m, p = measured(spec, how), fsdp_predicted(spec, how)
            errors.append(abs(p - m) / m)
            label = ", ".join(f"{k} {v}" for k, v in case.items() if k != "world")
            print(
                f"FSDP2 decoder {case['world']} ranks, rank {rank} ({label}): measured "
                f"{m / 2**20:8.2f} MiB | hookcli {p / 2**20:8.2f} MiB ({(p - m) / m:+.2%})",
                flush=True,
            )
    med, worst = statistics.median(errors), max(errors)
    print(f"FSDP2: median abs error {med:.2%}, worst {worst:.2%} over {len(errors)} rank steps")
    record("memory_fsdp_worst_error", 100 * worst, what="hookcli FSDP2 rank peak", unit="%")


if __name__ == "__main__":
    main()
