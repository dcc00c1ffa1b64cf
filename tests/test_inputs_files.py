"""Issue 18: --input-file, --inputs-from, inspect --no-forward, --columns, and the fixes
(tensors at any depth, LazyLinear, params_not_run, pruning); each against plain PyTorch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hookcli.structures import iter_tensors
from tests.conftest import invoke, invoke_json
from tests.fixtures import inputs_models as im

M = "tests.fixtures.inputs_models"


def root(report: dict) -> dict:
    return next(r for r in report["layers"] if r["name"] == "" and r["call"] == 0)


def one_error_line(result, code: int, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hookcli: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for w in words:
        assert w in lines[0], lines[0]


# -- --input-file --------------------------------------------------------------------


def test_stats_input_file_nested_dict_matches_plain_torch(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 4, generator=g)
    w = torch.randn(5, 3, generator=g)
    path = tmp_path / "batch.pt"
    torch.save({"batch": {"x": x, "w": w}}, path)
    report = invoke_json("stats", f"{M}:Batchy", "--input-file", str(path))
    torch.manual_seed(0)  # --seed 0 before the build, as hookcli does
    model = im.Batchy().eval()
    with torch.no_grad():
        expected = model({"x": x, "w": w})
    got = root(report)
    assert got["mean"] == pytest.approx(expected.mean().item(), rel=1e-6, abs=1e-7)
    assert got["max"] == pytest.approx(expected.max().item(), rel=1e-6)
    assert [i["name"] for i in report["inputs"]] == ["batch[x]", "batch[w]"]
    assert report["settings"]["inputs"] == f"--input-file {path}"


def _two_args_expected(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor | None = None):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = im.TwoArgs().eval()
    with torch.no_grad():
        return model(x, y) if scale is None else model(x, y, scale=scale)


@pytest.mark.parametrize("fmt", ["pt-tuple", "pt-list", "safetensors", "npz", "npz-kw"])
def test_input_file_formats_positional_and_keyword(tmp_path: Path, fmt: str) -> None:
    g = torch.Generator().manual_seed(3)
    x, y, s = (torch.randn(2, 4, generator=g) for _ in range(3))
    scale = None
    if fmt == "pt-tuple":
        path = tmp_path / "in.pt"
        torch.save((x, y), path)
    elif fmt == "pt-list":
        path = tmp_path / "in.pth"
        torch.save([x, y], path)
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "in.safetensors"
        save_file({"0": x, "1": y}, str(path))
    elif fmt == "npz":
        path = tmp_path / "in.npz"
        np.savez(path, **{"0": x.numpy(), "1": y.numpy()})
    else:
        path = tmp_path / "in.npz"
        np.savez(path, x=x.numpy(), y=y.numpy(), scale=s.numpy())
        scale = s
    report = invoke_json("stats", f"{M}:TwoArgs", "--input-file", str(path))
    expected = _two_args_expected(x, y, scale)
    assert root(report)["mean"] == pytest.approx(expected.mean().item(), rel=1e-6, abs=1e-7)


def test_input_file_npy_single_tensor_keeps_integer_dtype(tmp_path: Path) -> None:
    tokens = np.array([[1, 5, 2], [0, 3, 3]], dtype=np.int64)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    report = invoke_json(
        "inspect", "torch.nn:Embedding", "-k", "num_embeddings=8", "-k", "embedding_dim=4",
        "--input-file", str(path), "--dtype", "float64",
    )  # fmt: skip
    assert report["inputs"] == [{"name": "input", "shape": [2, 3], "dtype": "int64"}]
    assert root(report)["output_shapes"] == [[2, 3, 4]]


def test_input_file_dtype_casts_floating_tensors_only(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    torch.save(
        {"batch": {"x": torch.randn(2, 4), "w": torch.ones(2, 3, dtype=torch.float16)}}, path
    )
    report = invoke_json("inspect", f"{M}:Batchy", "--input-file", str(path), "--dtype", "float64")
    assert {i["dtype"] for i in report["inputs"]} == {"float64"}
    path2 = tmp_path / "keep.pt"
    torch.save(
        {"batch": {"x": torch.randn(2, 4), "w": torch.ones(2, 3, dtype=torch.float64)}}, path2
    )
    result = invoke("inspect", f"{M}:Batchy", "--input-file", str(path2), "--format", "json")
    # without --dtype the file's dtypes are kept: float32 @ float64 promotes, no cast
    assert result.exit_code == 0, result.stderr
    dtypes = [i["dtype"] for i in json.loads(result.stdout)["inputs"]]
    assert dtypes == ["float32", "float64"]


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_input_file_moves_to_the_device_keeping_dtypes(tmp_path: Path, dtype: str | None) -> None:
    x = torch.randn(2, 4).to(torch.float16)
    ids = torch.tensor([1, 7])
    path = tmp_path / "in.pt"
    torch.save({"x": x, "ids": ids}, path)
    extra = ["--dtype", dtype] if dtype else []
    im.SEEN.clear()
    report = invoke_json(
        "inspect", f"{M}:Seen", "--input-file", str(path), "--device", "meta", *extra
    )
    want = getattr(torch, dtype) if dtype else torch.float16  # --dtype casts floats only
    assert set(im.SEEN) == {("meta", want), ("meta", torch.int64)}, im.SEEN
    assert report["inputs"] == [
        {"name": "x", "shape": [2, 4], "dtype": str(want).removeprefix("torch.")},
        {"name": "ids", "shape": [2], "dtype": "int64"},
    ]
    model = im.Seen().to("meta", dtype=want if dtype else None)  # plain PyTorch on meta
    expected = model(x.to("meta", want), ids.to("meta"))
    assert root(report)["output_shapes"] == [list(expected.shape)]
    assert report["settings"]["device"] == "meta"


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.getcwd, ())


def test_bad_input_files_are_one_line_exit_2(tmp_path: Path) -> None:
    cases = []
    cases.append((tmp_path, "folder"))
    cases.append((tmp_path / "missing.pt", "no such file"))
    txt = tmp_path / "inputs.txt"
    txt.write_text("1 2 3")
    cases.append((txt, "unknown format"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    cases.append((junk, "not a torch.save file"))
    evil = tmp_path / "evil.pt"
    torch.save({"x": _Evil()}, evil)
    cases.append((evil, "weights_only"))
    npy = tmp_path / "objects.npy"
    np.save(npy, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases.append((npy, "pickled"))
    st = tmp_path / "bad.safetensors"
    st.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    cases.append((st, "safetensors"))
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    cases.append((fifo, "not a regular file"))
    for path, words in cases:
        result = invoke("inspect", f"{M}:Batchy", "--input-file", str(path))
        one_error_line(result, 2, "--input-file", words)


def test_input_file_that_forward_cannot_take_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    torch.save({"x": torch.randn(2, 4), "nope": torch.randn(2)}, path)
    result = invoke("inspect", f"{M}:TwoArgs", "--input-file", str(path))
    one_error_line(result, 2, "nope", "TwoArgs.forward(x, y, scale=None)")


def test_one_input_source_and_no_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    torch.save(torch.randn(2, 4), path)
    both = invoke("inspect", f"{M}:TwoArgs", "-i", "2x4", "--input-file", str(path))
    one_error_line(both, 2, "--input and --input-file")
    batch = invoke("inspect", f"{M}:TwoArgs", "-b", "3", "--input-file", str(path))
    one_error_line(batch, 2, "--batch-size")


# -- --inputs-from --------------------------------------------------------------------


def test_inputs_from_passes_int_string_none_namedtuple() -> None:
    report = invoke_json("stats", f"{M}:Odd", "--inputs-from", f"{M}:odd_inputs", "--seed", "5")
    torch.manual_seed(5)  # before the build
    model = im.Odd().eval()
    torch.manual_seed(5)  # right before the function, as documented
    args, kwargs = im.odd_inputs()
    with torch.no_grad():
        expected = model(*args, **kwargs)
    assert root(report)["mean"] == pytest.approx(expected.mean().item(), rel=1e-6, abs=1e-7)
    assert [i["name"] for i in report["inputs"]] == ["x", "p[0]", "p[1]"]


def test_inputs_from_file_path_and_plain_args() -> None:
    spec = f"{Path(im.__file__)}:odd_args_only"
    report = invoke_json("stats", f"{M}:Odd", "--inputs-from", spec)
    torch.manual_seed(0)
    model = im.Odd().eval()
    torch.manual_seed(0)
    args = im.odd_args_only()
    with torch.no_grad():
        expected = model(*args)
    assert root(report)["mean"] == pytest.approx(expected.mean().item(), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("no_colon", "FILE.py:FUNCTION"),
        (f"{M}:nothing_here", "no attribute 'nothing_here'"),
        (f"{M}:raises", "ValueError: no data here"),
        (f"{M}:Pair", "not a Python function"),
        ("missing/file.py:fn", "no such file"),
    ],
)
def test_bad_inputs_from_is_exit_2(spec: str, words: str) -> None:
    result = invoke("inspect", f"{M}:Odd", "--inputs-from", spec)
    one_error_line(result, 2, "--inputs-from", words)


# -- inspect --no-forward -------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "stats", "grads", "cost", "profile"])
def test_no_input_known_names_every_way_to_give_one(command: str) -> None:
    result = invoke(command, f"{M}:TwoArgs")
    one_error_line(result, 2, "no input known", "--input ", "--input-file", "--inputs-from")
    assert ("--no-forward" in result.stderr) == (command == "inspect"), result.stderr


def test_no_forward_reports_a_model_whose_forward_needs_an_int() -> None:
    without = invoke("inspect", f"{M}:NeedsInt")
    assert without.exit_code == 2  # no input known
    report = invoke_json("inspect", f"{M}:NeedsInt", "--no-forward")
    torch.manual_seed(0)
    model = im.NeedsInt()
    named = dict(model.named_modules())
    assert [r["name"] for r in report["layers"]] == list(named)
    for r in report["layers"]:
        m = named[r["name"]]
        assert r["type"] == type(m).__name__
        assert r["params"] == sum(p.numel() for p in m.parameters())
        assert r["own_params"] == sum(p.numel() for p in m.parameters(recurse=False))
        assert r["trainable_params"] == sum(p.numel() for p in m.parameters() if p.requires_grad)
        assert r["buffers"] == sum(b.numel() for b in m.buffers())
        assert r["own_buffers"] == sum(b.numel() for b in m.buffers(recurse=False))
        assert "input_shapes" not in r and "output_shapes" not in r
    assert report["totals"]["params"] == sum(p.numel() for p in model.parameters())
    assert report["settings"]["forward"] is False
    table = invoke("inspect", f"{M}:NeedsInt", "--no-forward")
    assert table.exit_code == 0
    assert "no forward run" in table.stdout


def test_no_forward_on_torchscript_and_hooks_still_refused() -> None:
    report = invoke_json("inspect", f"{M}:scripted_head", "--no-forward")
    scripted = im.scripted_head()
    assert [r["name"] for r in report["layers"]] == [n for n, _ in scripted.named_modules()]
    assert [r["type"] for r in report["layers"]] == ["Sequential", "Linear", "ReLU", "Linear"]
    assert report["totals"]["params"] == sum(p.numel() for p in scripted.parameters())
    refused = invoke("inspect", f"{M}:scripted_head", "-i", "2x8")
    one_error_line(refused, 2, "TorchScript", "--no-forward")


def test_no_forward_refuses_options_that_need_a_forward() -> None:
    result = invoke("inspect", f"{M}:NeedsInt", "--no-forward", "-i", "1x3x8x8", "--hooks", "pre")
    one_error_line(result, 2, "--hooks", "--input")
    result = invoke("inspect", f"{M}:NeedsInt", "--no-forward", "--columns", "mult_adds")
    one_error_line(result, 2, "mult_adds")


# -- --columns ------------------------------------------------------------------------


def test_columns_mult_adds_equals_cost_macs_per_row() -> None:
    for model in ("sample_models:LeNet", "sample_models.causal_lm:TinyCausalLM"):
        inspect = invoke_json("inspect", model, "--columns", "mult_adds")
        cost = invoke_json("cost", model)
        by_call = {(r["name"], r["call"], r["called"]): r["macs"] for r in cost["layers"]}
        assert len(inspect["layers"]) == len(cost["layers"])
        for r in inspect["layers"]:
            assert r["mult_adds"] == by_call[(r["name"], r["call"], r["called"])], r["name"]
        assert root(inspect)["mult_adds"] == cost["totals"]["macs"]


def test_columns_mult_adds_of_a_linear_is_its_multiply_adds() -> None:
    report = invoke_json("inspect", "sample_models:LeNet", "--columns", "mult_adds")
    # fc1 is Linear(400, 120) on a batch of 1: 400 * 120 multiply-adds (the bias adds no MAC)
    assert next(r for r in report["layers"] if r["name"] == "fc1")["mult_adds"] == 400 * 120


def test_columns_kernel_groups_percent_trainable_every_format() -> None:
    cols = "kernel_size,groups,param_percent,trainable"
    report = invoke_json("inspect", f"{M}:NeedsInt", "--no-forward", "--columns", cols)
    torch.manual_seed(0)
    model = im.NeedsInt()
    named = dict(model.named_modules())
    total = sum(p.numel() for p in model.parameters())
    for r in report["layers"]:
        m = named[r["name"]]
        if isinstance(m, nn.Conv2d):
            assert r["kernel_size"] == list(m.kernel_size) and r["groups"] == m.groups
        else:
            assert r["kernel_size"] is None and r["groups"] is None
        n = sum(p.numel() for p in m.parameters())
        assert r["param_percent"] == pytest.approx(100 * n / total)
        flags = {p.requires_grad for p in m.parameters()}
        assert r["trainable"] == (None if not flags else "partial" if len(flags) == 2 else True)
    assert next(r for r in report["layers"] if r["name"] == "dw")["groups"] == 8
    assert next(r for r in report["layers"] if r["name"] == "head")["trainable"] == "partial"
    csv = invoke("inspect", f"{M}:NeedsInt", "--no-forward", "--columns", cols, "-f", "csv")
    header = csv.stdout.splitlines()[0].split(",")
    assert {"kernel_size", "groups", "param_percent", "trainable"} <= set(header)
    md = invoke("inspect", f"{M}:NeedsInt", "--no-forward", "--columns", cols, "-f", "markdown")
    md_header = next(line for line in md.stdout.splitlines() if line.startswith("| name"))
    assert "| kernel_size | groups | param_percent | trainable |" in md_header
    table = invoke("inspect", f"{M}:NeedsInt", "--no-forward", "--columns", cols)
    assert "Kernel" in table.stdout and "Param %" in table.stdout and "3x3" in table.stdout
    bad = invoke("inspect", "sample_models:LeNet", "--columns", "kernel,groups")
    one_error_line(bad, 2, "unknown column 'kernel'")


# -- fixes ------------------------------------------------------------------------------


def test_four_deep_object_output_is_found() -> None:
    report = invoke_json("inspect", f"{M}:HighlyNestedDictModel")
    model = im.HighlyNestedDictModel()
    out = model(torch.zeros(2, 3))
    x = out["foo"][0]["bar"][0].x  # the one tensor, by hand
    assert root(report)["output_shapes"] == [list(x.shape)]


def test_any_depth_and_cycles() -> None:
    report = invoke_json("inspect", f"{M}:VeryDeep")
    assert root(report)["output_shapes"] == [[1, 2]]
    a, b = torch.zeros(1), torch.ones(2)
    cyclic: list = [a]
    cyclic.append(cyclic)  # a list holding itself
    cyclic.append((b, b))  # the same tensor twice is listed twice, like (x, x)
    assert [t.shape for t in iter_tensors(cyclic)] == [a.shape, b.shape, b.shape]


def test_params_on_lazy_linear_exits_0_and_counts_after_forward() -> None:
    report = invoke_json("params", f"{M}:lazy_mlp")
    lazy_rows = [r for r in report["params"] if r.get("uninitialized")]
    assert [r["name"] for r in lazy_rows] == ["0.weight", "0.bias"]
    assert all(r["numel"] == 0 and r["shape"] is None for r in lazy_rows)
    assert report["totals"]["params"] == 5 * 2 + 2  # the initialized Linear(5, 2) only
    table = invoke("params", f"{M}:lazy_mlp")
    assert table.exit_code == 0 and "not initialized yet" in table.stdout
    tree = invoke_json("inspect", f"{M}:lazy_mlp", "--no-forward")
    assert tree["totals"]["params"] == 12
    ran = invoke_json("inspect", f"{M}:lazy_mlp", "-i", "2x7")
    model = im.lazy_mlp()
    model(torch.zeros(2, 7))
    assert ran["totals"]["params"] == sum(p.numel() for p in model.parameters()) == 7 * 5 + 5 + 12


def test_params_not_run_equals_the_unused_branch() -> None:
    model = im.UnusedBranch()
    unused = sum(p.numel() for p in model.unused.parameters())
    for cmd in ("inspect", "grads"):
        report = invoke_json(cmd, f"{M}:UnusedBranch")
        assert report["totals"]["params_not_run"] == unused
    shallow = invoke_json("inspect", f"{M}:UnusedBranch", "-d", "0")
    assert shallow["totals"]["params_not_run"] == unused  # whatever --depth shows
    full = invoke_json("inspect", "sample_models:LeNet")
    assert full["totals"]["params_not_run"] == 0


def test_pruned_params_count_unmasked_weights() -> None:
    report = invoke_json("inspect", f"{M}:pruned_net", "-i", "2x10")
    torch.manual_seed(0)
    net = im.pruned_net()
    total = sum(p.numel() for p in net.parameters())
    zeros = sum(int((b == 0).sum()) for n, b in net.named_buffers() if n.endswith("_mask"))
    assert zeros == round(0.3 * 200) + round(0.5 * 100)
    assert report["totals"]["params"] == total
    assert report["totals"]["masked_params"] == zeros
    assert report["totals"]["pruned_params"] == total - zeros
    params = invoke_json("params", f"{M}:pruned_net")
    assert params["totals"]["pruned_params"] == total - zeros
    plain = invoke_json("inspect", "sample_models:LeNet")
    assert "pruned_params" not in plain["totals"]


def test_pruned_biases_count_too() -> None:
    report = invoke_json("inspect", f"{M}:pruned_bias_net", "-i", "2x10")
    torch.manual_seed(0)
    net = im.pruned_bias_net()
    zeros = {n: int((b == 0).sum()) for n, b in net.named_buffers() if n.endswith("_mask")}
    assert zeros == {"0.bias_mask": 5, "2.weight_mask": 50}
    total = sum(p.numel() for p in net.parameters())
    assert report["totals"]["masked_params"] == 55
    assert report["totals"]["pruned_params"] == total - 55
    table = invoke("params", f"{M}:pruned_bias_net")
    assert table.exit_code == 0, table.stderr
    assert f"{total - 55} (55 parameter elements zeroed" in table.stdout, table.stdout


def test_grads_and_cost_on_lazy_modules_initialize_them_first() -> None:
    report = invoke_json("grads", f"{M}:lazy_mlp", "-i", "2x7")
    torch.manual_seed(0)
    model = im.lazy_mlp()
    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.eval()(x)  # the initializing forward, as documented
    model.train()(x).sum().backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert report["totals"]["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert report["totals"]["params"] == 7 * 5 + 5 + 12
    cost = invoke("cost", f"{M}:lazy_mlp", "-i", "2x7")
    assert cost.exit_code == 0, cost.stderr
    assert "lazy modules" in cost.stderr


def test_api_columns_leave_the_model_as_found() -> None:
    import hookcli
    from sample_models import LeNet
    from tests.conftest import assert_no_hooks, state_snapshot

    torch.manual_seed(0)
    model = LeNet().train()
    x = torch.randn(2, 1, 32, 32)
    before = state_snapshot(model)
    report = hookcli.inspect(model, x, columns=["mult_adds", "trainable"])
    cost = hookcli.cost(model, x)
    assert [r["mult_adds"] for r in report.layers] == [r["macs"] for r in cost.layers]
    assert_no_hooks(model)
    after = state_snapshot(model)
    assert after["training"] == before["training"]
    assert all(m.training for m in model.modules())
