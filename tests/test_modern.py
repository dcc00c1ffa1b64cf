"""Modern models: hf: and timm: by name, meta builds at 7B/70B size, container rows,
safetensors and sharded checkpoints. Figures are checked against plain
transformers / timm / PyTorch, never against hookcli's own output."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from hookcli.errors import LoadError
from hookcli.loading import load_model
from hookcli.weights import apply_weights
from tests.conftest import assert_no_hooks, global_hook_counts, invoke, invoke_json

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LLAMA_SMALL = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 64,
}
BERT_SMALL = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "vocab_size": 200,
    "max_position_embeddings": 512,
}
T5_SMALL = {
    "num_layers": 1,
    "num_decoder_layers": 1,
    "d_model": 32,
    "d_ff": 64,
    "d_kv": 8,
    "num_heads": 4,
    "vocab_size": 150,
}


def kw_args(overrides: dict[str, Any]) -> list[str]:
    return [a for k, v in overrides.items() for a in ("-k", f"{k}={v}")]


def plain_hf(model_type: str, overrides: dict[str, Any], auto: str = "AutoModel") -> nn.Module:
    """The same model built by plain transformers, seeded as hookcli seeds it."""
    cfg = transformers.AutoConfig.for_model(model_type, **overrides, use_cache=False)
    torch.manual_seed(0)
    return getattr(transformers, auto).from_config(cfg)


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in set(model.parameters()))


def limit_memory() -> None:
    """A model built on the CPU by mistake fails instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))


def run_limited(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit_memory,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


# -- hf: small models on the CPU, with values ------------------------------------------------
def test_hf_decoder_grads_equal_plain_autograd():
    report = invoke_json("grads", "hf:llama", *kw_args(LLAMA_SMALL))
    model = plain_hf("llama", LLAMA_SMALL).train()
    g = torch.Generator().manual_seed(0)
    length = LLAMA_SMALL["max_position_embeddings"]  # 64 < 128: the config's limit
    ids = torch.randint(0, 300, (1, length), generator=g)
    mask = torch.randint(1, 2, (1, length), generator=g)
    out = model(input_ids=ids, attention_mask=mask)
    out.last_hidden_state.sum().backward()
    ref = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"), norm_type=2.0)
    assert report["totals"]["params"] == numel(model)
    assert report["inputs"] == [
        {"name": "input_ids", "shape": [1, length], "dtype": "int64"},
        {"name": "attention_mask", "shape": [1, length], "dtype": "int64"},
    ]
    loss = float(out.last_hidden_state.detach().sum())
    assert report["totals"]["loss"] == pytest.approx(loss, rel=1e-4)
    assert report["totals"]["grad_norm"] == pytest.approx(float(ref), rel=1e-4)


@pytest.mark.parametrize(
    ("model_type", "overrides", "names"),
    [
        ("bert", BERT_SMALL, ["input_ids", "attention_mask"]),
        ("t5", T5_SMALL, ["input_ids", "attention_mask", "decoder_input_ids"]),
    ],
)
def test_hf_encoder_and_encoder_decoder_shapes_equal_plain(model_type, overrides, names):
    report = invoke_json("inspect", f"hf:{model_type}", *kw_args(overrides))
    model = plain_hf(model_type, overrides).eval()
    assert [i["name"] for i in report["inputs"]] == names
    assert report["model"]["class"] == type(model).__name__
    assert report["totals"]["params"] == numel(model)
    g = torch.Generator().manual_seed(0)
    inputs = {}
    for info in report["inputs"]:
        high = 2 if info["name"] == "attention_mask" else overrides["vocab_size"]
        low = 1 if info["name"] == "attention_mask" else 0
        inputs[info["name"]] = torch.randint(low, high, tuple(info["shape"]), generator=g)
    with torch.no_grad():
        out = model(**inputs)
    root = report["layers"][0]
    assert root["name"] == "" and root["output_shapes"][0] == list(out.last_hidden_state.shape)
    # every row's params equal the module's own count, container rows included
    modules = dict(model.named_modules())
    for row in report["layers"]:
        assert row["params"] == numel(modules[row["name"]]), row["name"]


def test_hf_vision_default_input_from_image_size():
    overrides = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}
    overrides |= {"num_attention_heads": 2, "image_size": 64, "patch_size": 16}
    report = invoke_json("inspect", "hf:vit", *kw_args(overrides), "-d", "1")
    assert report["inputs"] == [
        {"name": "pixel_values", "shape": [1, 3, 64, 64], "dtype": "float32"}
    ]
    assert report["totals"]["params"] == numel(plain_hf("vit", overrides))


def test_hf_heads_and_errors():
    overrides = kw_args(LLAMA_SMALL)
    lm = invoke_json("inspect", "hf:llama:causal-lm", *overrides, "-d", "0")
    assert lm["model"]["class"] == "LlamaForCausalLM"
    assert lm["totals"]["params"] == numel(plain_hf("llama", LLAMA_SMALL, "AutoModelForCausalLM"))
    cls = invoke_json("inspect", "hf:bert:sequence-classification", *kw_args(BERT_SMALL), "-d", "0")
    assert cls["model"]["class"] == "BertForSequenceClassification"
    mlm = invoke_json("inspect", "hf:bert:masked-lm", *kw_args(BERT_SMALL), "-d", "0")
    assert mlm["model"]["class"] == "BertForMaskedLM"
    bad_head = invoke("inspect", "hf:llama:causal-llm")
    assert bad_head.exit_code == 2 and "causal-lm" in bad_head.stderr
    missing = invoke("inspect", "hf:someone/not-in-cache")
    assert missing.exit_code == 3
    assert "local Hugging Face cache" in missing.stderr and "never downloads" in missing.stderr
    typo = invoke("inspect", "hf:lama")
    assert typo.exit_code == 3 and "hf:llama" in typo.stderr
    assert "Traceback" not in missing.stderr + typo.stderr + bad_head.stderr


def test_hf_local_config_folder(tmp_path):
    cfg = transformers.AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=99)
    cfg.save_pretrained(tmp_path)
    report = invoke_json("inspect", f"hf:{tmp_path}", "-d", "0")
    assert report["model"]["class"] == "GPT2Model"
    assert report["inputs"][0] == {"name": "input_ids", "shape": [1, 128], "dtype": "int64"}
    assert report["totals"]["params"] == numel(
        plain_hf("gpt2", {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 99})
    )


# -- full size on meta -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "auto", "model_type"),
    [
        ("hf:llama", "AutoModel", "llama"),
        ("hf:llama:causal-lm", "AutoModelForCausalLM", "llama"),
        ("hf:bert", "AutoModel", "bert"),
        ("hf:t5", "AutoModel", "t5"),
    ],
)
def test_full_size_on_meta_equals_plain_transformers(spec, auto, model_type):
    result = run_limited("inspect", spec, "--device", "meta", "-f", "json", "-d", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    cfg = transformers.AutoConfig.for_model(model_type, use_cache=False)
    with torch.device("meta"):
        plain = getattr(transformers, auto).from_config(cfg)
    assert report["totals"]["params"] == numel(plain)
    if spec == "hf:llama:causal-lm":
        assert report["totals"]["params"] == 6_738_415_616  # Llama 2 7B
    modules = dict(plain.named_modules())
    containers = [r for r in report["layers"] if not r["called"]]
    assert containers, "the blocks' ModuleList has a row"
    for row in report["layers"]:
        assert row["params"] == numel(modules[row["name"]]), row["name"]
    if model_type == "llama":
        name = "layers" if auto == "AutoModel" else "model.layers"
        assert [r["name"] for r in containers] == [name]


@pytest.mark.parametrize(
    ("factory", "expected"),
    [("llama_7b", 6_738_415_616), ("llama_70b", 68_976_648_192)],
)
def test_file_decoder_on_meta_allocates_nothing(factory, expected):
    result = run_limited(
        "inspect", f"sample_models.decoder:{factory}", "--device", "meta", "-f", "json", "-d", "1"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    with torch.device("meta"):
        from sample_models import decoder

        plain = getattr(decoder, factory)()
    assert report["totals"]["params"] == numel(plain) == expected
    depth1 = [(r["name"], r["called"]) for r in report["layers"] if r["depth"] == 1]
    assert depth1 == [("embed_tokens", True), ("layers", False), ("norm", True), ("lm_head", True)]
    layers = next(r for r in report["layers"] if r["name"] == "layers")
    assert layers["params"] == numel(plain.layers)
    assert layers["input_shapes"] is None and layers["output_shapes"] is None


def test_meta_build_puts_parameters_on_meta_and_removes_its_hook():
    before = global_hook_counts()
    loaded = load_model(
        "sample_models.decoder:llama_7b", {"layers": 2}, device=torch.device("meta")
    )
    assert all(p.is_meta for p in loaded.module.parameters())
    assert global_hook_counts() == before
    assert_no_hooks(loaded.module, before)


def test_meta_build_falls_back_to_cpu_when_init_needs_values(capsys):
    loaded = load_model("tests.fixtures.metaonly:ValueInInit", device=torch.device("meta"))
    assert "building it on cpu" in capsys.readouterr().err
    assert loaded.module.proj.weight.shape == (4, 4)


# -- meta-only failures ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attr", "module", "op"),
    [("ItemInForward", "gate", "Tensor.item()")],
)
def test_meta_only_failures_name_module_and_op(attr, module, op):
    result = invoke("inspect", f"tests.fixtures.metaonly:{attr}", "--device", "meta")
    assert result.exit_code == 4
    line = result.stderr.strip().splitlines()[-1]
    assert f"in {module} " in line and op in line and "--device cpu" in line
    assert "Traceback" not in result.stderr
    # the same model runs on the CPU
    assert invoke("inspect", f"tests.fixtures.metaonly:{attr}").exit_code == 0


# -- timm ------------------------------------------------------------------------------------------
def test_timm_models_equal_plain_timm():
    timm = pytest.importorskip("timm")
    report = invoke_json("inspect", "timm:resnet18", "-d", "1")
    torch.manual_seed(0)
    plain = timm.create_model("resnet18", pretrained=False).eval()
    assert report["totals"]["params"] == numel(plain)
    size = plain.pretrained_cfg["input_size"]
    assert report["inputs"][0]["shape"] == [1, *size]
    with torch.no_grad():
        out = plain(torch.randn(1, *size, generator=torch.Generator().manual_seed(0)))
    assert report["layers"][0]["output_shapes"] == [list(out.shape)]
    vit = invoke_json("inspect", "timm:vit_tiny_patch16_224", "-d", "1", "--device", "meta")
    with torch.device("meta"):
        plain_vit = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    assert vit["totals"]["params"] == numel(plain_vit)
    unknown = invoke("inspect", "timm:resnet18x")
    assert unknown.exit_code == 3 and "timm:resnet18" in unknown.stderr


def test_models_lists_every_installed_source():
    report = invoke_json("models", "--filter", "*:llama")
    assert {r["name"] for r in report["models"]} >= {"hf:llama"}
    report = invoke_json("models", "--filter", "timm:resnet18", "--source", "timm")
    assert [r["name"] for r in report["models"]] == ["timm:resnet18"]


# -- containers at every depth -----------------------------------------------------------------
class Holder(nn.Module):
    """A plain module that is never called: it only holds its children."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"mix": nn.Linear(4, 4), "gate": nn.Linear(4, 4)}) for _ in range(3)
        )
        self.holder = Holder()
        self.unused = nn.Linear(4, 7)  # never runs
        self.extra = nn.ModuleList([nn.Linear(4, 5)])  # never runs, nor do its children
        self.example_input_array = torch.randn(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block["gate"](x) * block["mix"](x)
        return self.holder.b(self.holder.a(x))


@pytest.mark.parametrize("depth", [None, 0, 1, 2, 3])
def test_container_rows_sum_to_total_at_every_depth(depth):
    model = Nested()
    args = ["inspect", "tests.test_modern:Nested"] + ([] if depth is None else ["-d", str(depth)])
    report = invoke_json(*args)
    plain_total = numel(model)
    # at depth 0 the root's row holds its whole subtree, modules that never ran included
    never_ran = 0 if depth == 0 else numel(model.unused) + numel(model.extra)
    modules = dict(model.named_modules())
    for row in report["layers"]:
        assert row["params"] == numel(modules[row["name"]]), row["name"]
    # the table's Params column plus "did not run" equals the total, at this depth
    table = invoke(*args).stdout
    shown = 0
    for line in table.splitlines()[4:]:
        if not line.strip() or line.startswith("Total"):
            break
        shown += int(line.split()[-2].replace(",", ""))
    assert shown + never_ran == plain_total
    if never_ran:
        assert f"Params in modules that did not run: {never_ran:,}" in " ".join(table.split())
    else:
        assert "did not run" not in table


def test_container_rows_placed_before_first_descendant():
    report = invoke_json("inspect", "tests.test_modern:Nested")
    names = [(r["name"], r["called"]) for r in report["layers"]]
    assert names[:4] == [
        ("", True),
        ("blocks", False),
        ("blocks.0", False),
        ("blocks.0.gate", True),
    ]
    assert ("blocks.1", False) in names and ("holder", False) in names
    assert names.index(("holder", False)) + 1 == names.index(("holder.a", True))
    assert "unused" not in [n for n, _ in names] and "extra" not in [n for n, _ in names]


def test_container_grad_norm_is_joint_norm_of_subtree():
    report = invoke_json("grads", "tests.test_modern:Nested")
    torch.manual_seed(0)
    model = Nested().train()
    out = model(model.example_input_array)
    out.sum().backward()
    rows = {r["name"]: r for r in report["layers"]}
    grads = [p.grad for p in model.blocks.parameters()]
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert rows["blocks"]["grad_norm"] == pytest.approx(float(expected), rel=1e-5)


# -- checkpoints ---------------------------------------------------------------------------------
def seeded_lenet() -> nn.Module:
    from sample_models import LeNet

    torch.manual_seed(123)
    return LeNet()


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import save_file

    source = seeded_lenet()
    path = tmp_path / "lenet.safetensors"
    save_file(source.state_dict(), str(path))
    loaded = load_model("sample_models:LeNet", weights=path, seed=0)
    for k, v in source.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[k], v), k
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(source.state_dict(), str(folder / "model.safetensors"))
    again = load_model("sample_models:LeNet", weights=folder, seed=0)
    assert torch.equal(again.module.conv1.weight, source.conv1.weight)


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_checkpoint(tmp_path, kind):
    from safetensors.torch import save_file

    source = seeded_lenet()
    state = source.state_dict()
    keys = list(state)
    shards = {f"model-0000{i + 1}-of-00002.{kind}": keys[i::2] for i in range(2)}
    weight_map = {}
    for fname, ks in shards.items():
        part = {k: state[k].contiguous() for k in ks}
        if kind == "safetensors":
            save_file(part, str(tmp_path / fname))
        else:
            torch.save(part, tmp_path / fname)
        weight_map.update(dict.fromkeys(ks, fname))
    index = tmp_path / f"model.{kind}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_model("sample_models:LeNet", weights=index, seed=0)
    for k, v in state.items():
        assert torch.equal(loaded.module.state_dict()[k], v), k
    # a shard that is not there is named
    (tmp_path / next(iter(shards))).unlink()
    with pytest.raises(LoadError, match="names shard"):
        load_model("sample_models:LeNet", weights=index, seed=0)


def test_tied_key_left_out_is_not_missing(tmp_path):
    from safetensors.torch import save_file

    from sample_models import TiedEmbeddingLM

    model = TiedEmbeddingLM()
    state = model.state_dict()
    tied = [k for k in state if k.endswith("head.weight") or k.endswith("lm_head.weight")]
    assert tied, list(state)
    kept = {k: v.clone() for k, v in state.items() if k not in tied}
    path = tmp_path / "tied.safetensors"
    save_file(kept, str(path))
    apply_weights(TiedEmbeddingLM(), path)  # no error: the tied key shares a saved tensor
    broken = dict(kept)
    broken.pop(next(iter(kept)))
    save_file(broken, str(tmp_path / "broken.safetensors"))
    with pytest.raises(LoadError, match="missing keys"):
        apply_weights(TiedEmbeddingLM(), tmp_path / "broken.safetensors")


def test_weights_on_meta_are_checked_not_loaded(tmp_path):
    from safetensors.torch import save_file

    source = seeded_lenet()
    path = tmp_path / "w.safetensors"
    save_file(source.state_dict(), str(path))
    ok = invoke("inspect", "sample_models:LeNet", "--device", "meta", "--weights", str(path))
    assert ok.exit_code == 0 and "no values are loaded" in ok.stderr
    state = source.state_dict()
    state["fc1.weight"] = torch.zeros(3, 3)
    save_file(state, str(path))
    bad = invoke("inspect", "sample_models:LeNet", "--device", "meta", "--weights", str(path))
    assert bad.exit_code == 3 and "fc1.weight [3, 3]" in bad.stderr


def test_not_a_checkpoint_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    result = invoke("inspect", "sample_models:LeNet", "--weights", str(junk))
    assert result.exit_code == 3 and "not a safetensors file" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("inspect", "sample_models:LeNet", "--weights", str(empty))
    assert result.exit_code == 3 and "no checkpoint" in result.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_build_directly_on_cuda():
    loaded = load_model("sample_models:LeNet", device=torch.device("cuda"))
    assert all(p.is_cuda for p in loaded.module.parameters())
    report = invoke_json("inspect", "sample_models:LeNet", "--device", "cuda")
    assert report["settings"]["device"].startswith("cuda")


def test_registrations_of_a_7b_model_on_meta():
    result = run_limited(
        "registrations", "sample_models.decoder:llama_7b", "--device", "meta", "-f", "json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    with torch.device("meta"):
        from sample_models import decoder

        plain = decoder.llama_7b()
    params = [r for r in report["registrations"] if r["kind"] == "parameter"]
    assert len(params) == len(list(plain.parameters()))
    assert sum(torch.Size(r["shape"]).numel() for r in params) == numel(plain)


@pytest.mark.parametrize("command", ["inspect", "cost"])
def test_meta_run_says_which_checks_it_took_as_true(command):
    # nonzero on a mask meta does not hold: taken as all true, and stated
    result = invoke(
        command, "tests.fixtures.metaonly:NonzeroInForward", "--device", "meta", "-f", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert "takes the mask as all true (1x)" in result.stderr
    stated = json.loads(result.stdout)["settings"]["meta_assumptions"]
    assert any("mask as all true" in s for s in stated)
    # llama's "is the mask all ones?" is decided from the drawn mask's values: no stand-in
    llama = invoke(command, "hf:llama", *kw_args(LLAMA_SMALL), "--device", "meta", "-d", "0")
    assert llama.exit_code == 0 and "synthesized" not in llama.stderr
    plain = invoke(command, "sample_models.decoder:Decoder", "--device", "meta", "-d", "0")
    assert plain.exit_code == 0 and "synthesized" not in plain.stderr
