"""`hookcli compare` when a model raises: the report of the calls compared before the
failure (their figures against plain PyTorch hooks on the same models), the failing
module marked on its side, the one-line error, exit 4, and both models left as found."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import assert_no_hooks, invoke, plain_forward, state_snapshot

HERE = "tests.test_compare_failure"


class _BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("bad grad")


class Act(nn.Module):
    # counts its calls over the model's life: fail_at=2 raises on the third call
    def __init__(self, fail_at=None, bad_grad=False):
        super().__init__()
        self.fail_at = fail_at
        self.bad_grad = bad_grad
        self.n = 0

    def forward(self, x):
        n = self.n
        self.n += 1
        if self.fail_at is not None and n == self.fail_at:
            raise RuntimeError(f"act call {n}")
        y = torch.relu(x)
        return _BadGrad.apply(y) if self.bad_grad else y


class Net(nn.Module):
    """One activation module called three times (act, act #1, act #2)."""

    def __init__(self, fail_at=None, bad_grad=False, scale=1.0):
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.act = Act(fail_at, bad_grad)
        self.l2 = nn.Linear(4, 4)
        self.l3 = nn.Linear(4, 2)
        self.scale = scale

    def forward(self, x):
        x = self.act(self.l1(x) * self.scale)
        x = self.act(self.l2(x))
        return self.l3(self.act(x))


class Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


class Chain(nn.Module):
    def __init__(self, bad=False):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = Boom() if bad else nn.ReLU()
        self.c = nn.Linear(4, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


X = torch.linspace(-1.0, 1.0, 8).reshape(2, 4)


@pytest.fixture()
def xfile(tmp_path: Path) -> str:
    path = tmp_path / "x.pt"
    torch.save(X, path)
    return str(path)


def plain_outputs(model: nn.Module) -> dict[tuple[str, int], torch.Tensor]:
    """Every module call's output by (name, call), from plain forward hooks; the calls
    that returned before the model raised."""
    outs: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for name, m in model.named_modules():

        def hook(mod: nn.Module, a: Any, out: Any, name: str = name) -> None:
            k = sum(1 for n, _ in outs if n == name)
            outs[(name, k)] = out.detach().clone()

        handles.append(m.register_forward_hook(hook))
    with contextlib.suppress(RuntimeError):  # (the calls before the raise are kept)
        plain_forward(model, (X,), handles)
    return outs


def built(**kwargs: Any) -> Net:
    torch.manual_seed(0)  # as hookcli builds a model (--seed 0)
    return Net(**kwargs)


def run(*args: str) -> tuple[int, str, str]:
    result = invoke("compare", *args)
    return result.exit_code, result.stdout, result.stderr


def rows_by_call(report: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["name"], r["call"]): r for r in report["calls"]}


def test_b_failing_reports_the_calls_before_it_with_plain_hooks_figures(xfile: str) -> None:
    """B (scaled after l1, a planted difference) raises in act's third call: the calls
    that returned before it carry the figures plain hooks give, the failing call is
    marked on B's side, and the error is one line naming B, the module and its input."""
    code, out, err = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "fail_at=2",
                         "--b-kwargs", "scale=2.0", "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert report["error"].startswith("B: forward failed in act (Act) with input shapes [2, 4]")
    assert err.strip().splitlines() == [f"hookcli: error: {report['error']}"]
    (failure,) = report["failures"]
    assert failure["side"] == "B" and failure["mode"] == "propagated"
    assert (failure["module"], failure["call"], failure["phase"]) == ("act", 2, "forward")
    assert failure["input_shapes"] == [[2, 4]]
    ref_a, ref_b = plain_outputs(built()), plain_outputs(built(fail_at=2, scale=2.0))
    rows = rows_by_call(report)
    compared = [k for k in ref_b if k in ref_a]
    assert sorted(compared) == sorted([("l1", 0), ("act", 0), ("l2", 0), ("act", 1)])
    for key in compared:
        a, b = ref_a[key].double(), ref_b[key].double()
        row = rows[key]
        assert row["partner"] == key[0] and row["partner_call"] == key[1]
        assert row["max_abs"] == pytest.approx(float((a - b).abs().max()), rel=1e-6, abs=1e-9)
        rel = float((a - b).norm() / a.norm())
        assert row["rel_l2"] == pytest.approx(rel, rel=1e-6, abs=1e-12)
    assert rows[("l1", 0)]["max_abs"] == 0  # same weights, same input: exact before the bug
    assert rows[("act", 0)]["max_abs"] > 0  # the planted scale
    assert report["first_divergence"]["module"] == "act"
    # the calls past the failure are rows without figures; the local mode did not run
    for key in [("act", 2), ("l3", 0), ("", 0)]:
        assert rows[key]["partner"] is None and rows[key]["max_abs"] is None
    assert all(r["local_rel_l2"] is None for r in report["calls"])
    assert report["first_divergence_local"] is None


@pytest.mark.parametrize("side", ["A", "B"])
def test_the_table_marks_the_failed_call_of_the_side_that_failed(xfile: str, side: str) -> None:
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", f"--{side.lower()}-kwargs", "fail_at=2",
                       "--input-file", xfile)  # fmt: skip
    assert code == 4
    lines = out.splitlines()
    assert any(ln.lstrip().startswith(f"act #2 <- failed here ({side})") for ln in lines), out
    assert lines[-1].startswith(f"ERROR: {side}: forward failed in act (Act)")
    assert any(ln.startswith("First divergence (local):") and "not run" in ln for ln in lines)


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown_carry_the_rows_before_the_failure(xfile: str, fmt: str) -> None:
    code, out, _ = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True",
                       "--copy-weights", "--input-file", xfile, "-f", fmt)  # fmt: skip
    assert code == 4
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        a = next(r for r in rows if r["name"] == "a")
        assert a["partner"] == "a" and float(a["max_abs"]) == 0.0
        assert {r["name"] for r in rows} >= {"", "a", "b", "c"}
    else:
        assert "| a | Linear |" in out and "| b | ReLU |" in out


def test_output_file_and_html_page_are_written_before_exit_4(tmp_path: Path, xfile: str) -> None:
    for name in ("r.json", "r.html"):
        target = tmp_path / name
        code, _, err = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True",
                           "--copy-weights", "--input-file", xfile, "-o", str(target),
                           *(["-f", "json"] if name.endswith(".json") else []))  # fmt: skip
        assert code == 4 and "B: forward failed in b (Boom)" in err
        text = target.read_text(encoding="utf-8")
        if name.endswith(".json"):
            assert json.loads(text)["failures"][0]["module"] == "b"
        else:
            assert "forward failed in b (Boom)" in text


def test_copy_weights_after_b_failed_copies_what_ran(xfile: str) -> None:
    """B's c never ran (B raised in b): its weights are not needed, so --copy-weights
    does not refuse B; a returned the same as A's."""
    code, out, _ = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True",
                       "--copy-weights", "--seed", "3", "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert [c["b"] for c in report["copied_weights"]] == ["a.weight", "a.bias"]
    assert rows_by_call(report)[("a", 0)]["max_abs"] == 0


def test_both_sides_failing_alike_is_one_error_naming_both(xfile: str) -> None:
    code, out, err = run(f"{HERE}:Chain", f"{HERE}:Chain", "-k", "bad=True",
                         "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert report["error"].startswith("A and B: forward failed in b (Boom)")
    assert [f["side"] for f in report["failures"]] == ["A", "B"]
    assert err.startswith("hookcli: error: A and B: forward failed in b")
    table = run(f"{HERE}:Chain", f"{HERE}:Chain", "-k", "bad=True", "--input-file", xfile)[1]
    assert "b <- failed here (A and B)" in table


def test_a_failure_in_the_local_mode_keeps_the_propagated_figures(xfile: str) -> None:
    """B raises on act's fourth call: its propagated pass (three calls) is whole, so every
    propagated figure is there, as plain hooks give it; the local mode stops in act."""
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "fail_at=3",
                       "--b-kwargs", "scale=2.0", "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    (failure,) = report["failures"]
    assert (failure["side"], failure["mode"], failure["module"]) == ("B", "local", "act")
    assert report["error"].startswith("B (local mode): forward failed in act")
    ref_a, ref_b = plain_outputs(built()), plain_outputs(built(scale=2.0))
    rows = rows_by_call(report)
    assert set(ref_a) == set(ref_b) == set(rows)
    for key, a in ref_a.items():
        b = ref_b[key]
        assert rows[key]["max_abs"] == pytest.approx(float((a - b).abs().max()), rel=1e-6)
    assert report["first_divergence"]["module"] == ""  # the scale is the root's own code
    assert rows[("l1", 0)]["local_max_abs"] == 0  # measured before the local pass stopped


def test_a_failure_in_backward_keeps_the_forward_figures(xfile: str) -> None:
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "bad_grad=True",
                       "--backward", "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    (failure,) = report["failures"]
    assert (failure["side"], failure["phase"]) == ("B", "backward")
    assert report["error"].startswith("B: backward failed in act (Act)")
    rows = rows_by_call(report)
    assert len(rows) == 7 and all(r["max_abs"] == 0 for r in rows.values())


@pytest.mark.parametrize("scale, failed_check", [("2.0", True), ("1.0", False)])
def test_fail_on_divergence_after_a_failure(xfile: str, scale: str, failed_check: bool) -> None:
    """A divergence found before the failure fails the gate; none found decides nothing
    (no check); the exit status is 4 either way."""
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "fail_at=2",
                       "--b-kwargs", f"scale={scale}", "--input-file", xfile,
                       "--fail-on", "divergence", "-f", "json")  # fmt: skip
    assert code == 4
    checks = json.loads(out)["checks"]
    if failed_check:
        assert [(c["name"], c["passed"], c["layers"]) for c in checks] == [
            ("divergence", False, ["act"])
        ]
    else:
        assert checks == []


def test_on_meta_the_shapes_before_the_failure_are_reported() -> None:
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "fail_at=1", "-i", "2x4",
                       "--device", "meta", "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert report["values_compared"] is False
    assert report["failures"][0]["module"] == "act" and report["failures"][0]["call"] == 1
    rows = rows_by_call(report)
    assert [k for k, r in rows.items() if r["partner"] is not None] == [
        ("l1", 0), ("act", 0), ("l2", 0)
    ]  # fmt: skip


def _sides(a: nn.Module, b: nn.Module) -> Any:
    from hookcli.api import live
    from hookcli.compare.runner import Side
    from hookcli.compare.settings import Vs
    from hookcli.options import Mode

    pa, pb = live(a, (X,), None, Mode.EVAL, 0), live(b, (X,), None, Mode.EVAL, 0)
    return Side("A", pa, a, Vs(), 0), Side("B", pb, b, Vs(), 0)


@pytest.mark.parametrize("backward, align", [(False, "auto"), (False, "order"), (True, "auto")])
@pytest.mark.parametrize("failing", ["a", "b"])
def test_both_models_are_left_as_found_after_a_failure(
    failing: str, backward: bool, align: str
) -> None:
    """The report of a failed run (the CLI's path: A and B in step, or one after the
    other under --align order and --backward) leaves no hook, and the modes and grads as
    they were."""
    from hookcli.compare.runner import Plan, run_compare
    from hookcli.options import Mode

    kw: dict[str, Any] = {"bad_grad": True} if backward else {"fail_at": 1}
    a, b = built(**kw) if failing == "a" else built(), built(**kw) if failing == "b" else built()
    for m in (a, b):
        m.train()
        m.l2.eval()
    before = [state_snapshot(m) for m in (a, b)]
    plan = Plan(align=align, partial=True, backward=backward)
    report = run_compare(*_sides(a, b), plan, Mode.EVAL)
    assert not isinstance(report, str)
    assert report.failure is not None and report.error.startswith(failing.upper())
    for m, snap in zip((a, b), before, strict=True):
        assert_no_hooks(m)
        after = state_snapshot(m)
        assert after["training"] == snap["training"]
        assert after["grads"] == snap["grads"] == {k: None for k in snap["grads"]}
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_the_python_api_raises_the_run_error_naming_the_side() -> None:
    """``hookcli.compare`` raises, as the other API functions do (no partial report)."""
    import hookcli
    from hookcli.errors import RunError

    a, b = built(), built(fail_at=0)
    with pytest.raises(RunError, match=r"^B: forward failed in act \(Act\)"):
        hookcli.compare(a, b, (X,))
    assert_no_hooks(a)
    assert_no_hooks(b)


def test_a_loss_that_raises_keeps_the_forward_figures(tmp_path: Path, xfile: str) -> None:
    loss = tmp_path / "lossfn.py"
    loss.write_text("def bad(out):\n    raise ValueError('no loss')\n", encoding="utf-8")
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "scale=2.0", "--backward",
                         "--loss", f"fn:{loss}:bad", "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert [(f["side"], f["phase"]) for f in report["failures"]] == [("A", "loss"), ("B", "loss")]
    assert report["error"].startswith("A and B: the loss function")
    ref_a, ref_b = plain_outputs(built()), plain_outputs(built(scale=2.0))
    rows = rows_by_call(report)
    assert set(rows) == set(ref_a)
    for key, a in ref_a.items():
        assert rows[key]["max_abs"] == pytest.approx(float((a - ref_b[key]).abs().max()), rel=1e-6)
    assert all(r["grad_input_rel_l2"] is None for r in report["calls"])


class Outer(nn.Module):
    """Net one level down (``n``), then a head: a failure in n's act is at depth 2."""

    def __init__(self, fail_at=None, scale=1.0):
        super().__init__()
        self.n = Net(fail_at=fail_at, scale=scale)
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.n(x))


@pytest.mark.parametrize(
    "kwargs, who",
    [(("--a-kwargs", "fail_at=1"), "A"),
     (("--a-kwargs", "fail_at=2", "--b-kwargs", "fail_at=1"), "A and B"),
     (("--b-kwargs", "fail_at=1"), "B")],
)  # fmt: skip
def test_depth_marks_the_row_holding_a_call_that_failed(
    xfile: str, kwargs: tuple[str, ...], who: str
) -> None:
    """--depth 1 hides n's act: n's row says a call in it failed, on either side, also
    where n itself never returned on A's side (the error is raised in act, the models'
    own code says so)."""
    with pytest.raises(RuntimeError, match="act call 1"):
        Outer(fail_at=1)(X)
    code, out, _ = run(f"{HERE}:Outer", f"{HERE}:Outer", *kwargs, "--depth", "1",
                       "--input-file", xfile)  # fmt: skip
    assert code == 4
    marked = [ln.split()[0] for ln in out.splitlines() if "failed" in ln and "<-" in ln]
    assert marked == ["n"], out
    assert f"n <- failed inside ({who})" in out


def test_depth_marks_a_first_divergence_inside_a_call_of_a_that_never_returned(
    xfile: str,
) -> None:
    """B scales after n.l1 (its act's input differs: plain hooks show it), A fails in
    act's third call: the first divergence is inside n, which never returned on A."""
    a, b = plain_outputs(built(fail_at=2)), plain_outputs(built(scale=2.0))
    assert torch.equal(a[("l1", 0)], b[("l1", 0)]) and not torch.equal(a[("act", 0)], b[("act", 0)])
    code, out, _ = run(f"{HERE}:Outer", f"{HERE}:Outer", "--a-kwargs", "fail_at=2",
                       "--b-kwargs", "scale=2.0", "--depth", "1", "--input-file", xfile)  # fmt: skip
    assert code == 4
    (row,) = [ln for ln in out.splitlines() if ln.startswith("  n ")]
    assert "failed inside (A); first divergence inside" in row, out


def _summary(out: str, label: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(label + ":")]
    return line.partition(":")[2].strip()


def test_a_failure_in_the_local_mode_leaves_the_forward_summary_complete(xfile: str) -> None:
    """B raises on act's fourth call (the local pass alone): plain hooks give equal
    outputs for every call, so the propagated line reads as a complete run's."""
    ref_a, ref_b = plain_outputs(built()), plain_outputs(built())
    assert all(torch.equal(ref_a[k], ref_b[k]) for k in ref_a)
    code, out, _ = run(f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "fail_at=3",
                       "--input-file", xfile)  # fmt: skip
    assert code == 4
    assert _summary(out, "First divergence") == "none (every aligned call within tolerance)"
    assert _summary(out, "First divergence (local)") == (
        "none in the calls compared before the failure"
    )


def test_a_failure_in_backward_checks_the_complete_forward(xfile: str) -> None:
    """B's backward raises: the forward is whole (plain hooks: equal outputs), so the
    divergence check is given over it and says the gradients are not complete; the local
    mode did not run."""
    ref_a, ref_b = plain_outputs(built()), plain_outputs(built(bad_grad=True))
    assert all(torch.equal(ref_a[k], ref_b[k]) for k in ref_a)
    args = (f"{HERE}:Net", f"{HERE}:Net", "--b-kwargs", "bad_grad=True", "--backward",
            "--input-file", xfile, "--fail-on", "divergence")  # fmt: skip
    code, out, _ = run(*args)
    assert code == 4
    assert _summary(out, "First divergence") == "none (every aligned call within tolerance)"
    assert _summary(out, "First grad divergence") == (
        "none in the gradients that arrived before the failure"
    )
    assert _summary(out, "First grad divergence (local)").startswith("not run")
    (check,) = json.loads(run(*args, "-f", "json")[1])["checks"]
    assert check["name"] == "divergence" and check["passed"] is True
    assert "gradients are not complete" in check["detail"]


def test_a_forward_failure_says_the_local_gradients_did_not_run(xfile: str) -> None:
    code, out, _ = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True",
                       "--backward", "--input-file", xfile)  # fmt: skip
    assert code == 4
    assert _summary(out, "First divergence (local)").startswith("not run")
    assert _summary(out, "First grad divergence (local)").startswith("not run")


def test_calls_b_never_reached_are_not_compared_rather_than_unaligned(xfile: str) -> None:
    """B raises in b: plain hooks on B see only a return; A's other calls (the root, b,
    c) have a partner module B never returned from: listed as not compared."""
    torch.manual_seed(0)
    returned_b = {name for name, _ in plain_outputs(Chain(bad=True))}
    torch.manual_seed(0)
    calls_a = {name for name, _ in plain_outputs(Chain())}
    assert returned_b == {"a"}
    code, out, _ = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True",
                       "--input-file", xfile, "-f", "json")  # fmt: skip
    assert code == 4
    report = json.loads(out)
    assert report["unaligned_a"] == []
    assert {c["name"] for c in report["not_compared"]} == calls_a - returned_b
    assert report["totals"]["not_compared"] == len(calls_a - returned_b)
    text = run(f"{HERE}:Chain", f"{HERE}:Chain", "--b-kwargs", "bad=True", "--input-file",
               xfile)[1]  # fmt: skip
    assert "Unaligned in A" not in text
    assert _summary(text, "Not compared (B failed)") == "(root), b, c"
