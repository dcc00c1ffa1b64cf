"""Every transformers type by name on meta: inputs from the config, value stand-ins
(balanced MoE routing), no allocation while building, the model's error first.

The full-size models run in a subprocess under an address-space cap (a build that
allocated would fail there instead of taking the machine); their parameter counts
are checked against plain ``with torch.device("meta"): AutoModel.from_config(...)``
computed in another capped subprocess, and the child's own peak RSS (``VmHWM`` of
``/proc/self/status``, which starts afresh at ``exec``; ``ru_maxrss`` would carry over
the high-water mark of the pytest process it was forked from) against 1.5 GiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import invoke, invoke_json

ROOT = Path(__file__).resolve().parents[1]
CAP_BYTES = 12 << 30  # address space per child: torch's CUDA libraries map ~4 GiB
RSS_LIMIT_KIB = int(1.5 * (1 << 20))  # 1.5 GiB in ru_maxrss's KiB

_PRELUDE = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({CAP_BYTES}, {CAP_BYTES})); "


def _capped(code: str, timeout: float = 600) -> tuple[int, str, str, int]:
    """Run Python ``code`` in a child with the address-space cap: (rc, out, err, maxrss KiB)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOOKCLI_NO_CONFIG": "1", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {err[-500:]}")
    # the child reports its own peak (VmHWM, in KiB) as its last stderr line
    lines = err.strip().splitlines()
    rss = (
        int(lines[-1].removeprefix("MAXRSS ")) if lines and lines[-1].startswith("MAXRSS ") else -1
    )
    return proc.returncode, out, err, rss


def _hookcli(*argv: str) -> tuple[int, str, str, int]:
    """``hookcli ARGV`` in a capped child; its own VmHWM is read just before it exits."""
    code = textwrap.dedent(
        f"""
        import atexit, sys
        def own_peak_kib():  # VmHWM: this process's peak since exec, in KiB
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        atexit.register(lambda: print("MAXRSS", own_peak_kib(), file=sys.stderr, flush=True))
        sys.argv = ["hookcli", *{list(argv)!r}]
        from hookcli.cli import main
        main()
        """
    )
    return _capped(code)


def _plain_params(types: list[str]) -> dict[str, int]:
    """The reference: ``AutoModel.from_config`` under ``torch.device("meta")``, capped."""
    code = textwrap.dedent(
        f"""
        import json, torch, transformers as tf
        tf.logging.set_verbosity_error()
        out = {{}}
        for t in {types!r}:
            with torch.device("meta"):
                m = tf.AutoModel.from_config(tf.AutoConfig.for_model(t))
            out[t] = sum(p.numel() for p in {{id(p): p for p in m.parameters()}}.values())
            del m
        print(json.dumps(out))
        """
    )
    rc, out, err, _ = _capped(code)
    assert rc == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _check_types(types: list[str]) -> None:
    plain = _plain_params(types)
    for t in types:
        rc, out, err, rss = _hookcli(
            "inspect", f"hf:{t}", "--device", "meta", "-d", "1", "--format", "json"
        )
        assert rc == 0, f"hf:{t}: {err[-1500:]}"
        report = json.loads(out)
        assert report["totals"]["params"] == plain[t], t
        assert 0 < rss <= RSS_LIMIT_KIB, f"hf:{t} peak RSS {rss} KiB"


FAST = ["mixtral", "whisper", "bit"]
SLOW = ["qwen3_moe", "deepseek_v2", "llava", "conditional_detr", "gemma3n_audio", "mistral_large4"]


@pytest.mark.slow  # four capped interpreters, each importing torch and transformers
def test_representative_types_report_at_full_size_on_meta() -> None:
    """MoE (grouped mm), speech seq2seq (decoder start ids), vision: exit 0, exact params."""
    _check_types(FAST)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", SLOW)
def test_issue_types_report_at_full_size_on_meta(model_type: str) -> None:
    _check_types([model_type])


# -- value synthesis, on small models (no transformers) ------------------------------------
class _Router(nn.Module):
    """A top-k MoE router: per-expert counts by bincount, rows split at the offsets."""

    def __init__(self, dim: int = 8, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.w = nn.Parameter(torch.randn(experts, dim, dim))
        self.experts, self.k = experts, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.topk(self.gate(x), self.k, dim=-1).indices.reshape(-1)
        counts = torch.bincount(idx, minlength=self.experts)
        self.counts = counts.tolist()
        order = torch.argsort(idx)
        rows = x.repeat_interleave(self.k, dim=0)[order]
        outs = [rows[s:e] @ self.w[g] for g, (s, e) in enumerate(_spans(self.counts))]
        return torch.cat(outs)


def _spans(counts: list[int]) -> list[tuple[int, int]]:
    ends, start = [], 0
    for c in counts:
        ends.append((start, start + c))
        start += c
    return ends


def test_meta_routing_is_balanced_and_stated() -> None:
    """On meta, top-k routing spreads tokens evenly: 12 tokens x top-2 over 4 experts = 6 each."""
    from hookcli.metavalues import MetaValues

    model = _Router().to("meta")
    x = torch.empty(12, 8, device="meta")
    with MetaValues() as mv:
        out = model(x)
    assert model.counts == [12 * 2 // 4] * 4
    assert out.shape == (24, 8)
    assert mv.assumed["routing"] >= 1


def test_meta_values_of_integer_inputs_are_exact() -> None:
    """Integer inputs drawn on meta keep their values: a data-dependent length matches cpu."""

    class Prefix(nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            n = int((ids < 50).sum())
            return ids[:, :n].float() * 2

    report_cpu = invoke_json("inspect", f"{_write(Prefix)}:Prefix", "-i", "int64:1x40:0..100")
    report_meta = invoke_json(
        "inspect", f"{_write(Prefix)}:Prefix", "-i", "int64:1x40:0..100", "--device", "meta"
    )
    assert report_meta["layers"][0]["output_shapes"] == report_cpu["layers"][0]["output_shapes"]


_FILES: dict[str, str] = {}


def _write(cls: type) -> str:
    """A model class as a file the CLI can load (``file.py:Class``)."""
    import inspect as pyinspect
    import tempfile

    if cls.__name__ not in _FILES:
        src = "import torch\nfrom torch import nn\n\n\n" + textwrap.dedent(pyinspect.getsource(cls))
        path = Path(tempfile.mkdtemp()) / f"{cls.__name__.lower()}.py"
        path.write_text(src)
        _FILES[cls.__name__] = str(path)
    return _FILES[cls.__name__]


def test_model_error_comes_first_not_a_meta_claim(tmp_path: Path) -> None:
    """A model's own ValueError is printed first and not called a meta limitation."""
    path = tmp_path / "bad.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Bad(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n        y = self.l(x)\n"
        "        raise ValueError('You cannot specify both a and b')\n"
    )
    result = invoke("inspect", f"{path}:Bad", "-i", "1x4", "--device", "meta")
    assert result.exit_code == 4
    line = result.stderr.strip().splitlines()[-1]
    assert "ValueError: You cannot specify both a and b" in line
    assert "needs tensor values" not in line and "on meta" not in line


def test_numeric_item_on_meta_says_it_needs_values(tmp_path: Path) -> None:
    """A float ``.item()`` really has no value on meta: the op's error, then hookcli's reading."""
    path = tmp_path / "scale.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Scale(nn.Module):\n"
        "    def forward(self, x):\n        return x * float(x.abs().max().item())\n"
    )
    result = invoke("inspect", f"{path}:Scale", "-i", "1x4", "--device", "meta")
    assert result.exit_code == 4
    line = result.stderr.strip().splitlines()[-1]
    assert line.index("NeedsValues: Tensor.item()") < line.index("(on meta:")
    assert "--device cpu" in line


def test_build_on_meta_allocates_no_buffer_with_an_explicit_device(tmp_path: Path) -> None:
    """``torch.zeros(..., device="cpu")`` in __init__ (4 TiB) lands on meta, as does .to('cpu');
    construction code that reads small values (linspace().tolist()) still works."""
    path = tmp_path / "huge.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Huge(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.register_buffer('table', torch.zeros(1 << 40, device='cpu'))\n"
        "        self.register_buffer('other', torch.ones(1 << 40).to('cpu'))\n"
        "        self.rates = torch.linspace(0, 0.5, 3).tolist()\n"
        "        self.l = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n        return self.l(x) * self.rates[-1]\n"
    )
    report = invoke_json("inspect", f"{path}:Huge", "-i", "1x4", "--device", "meta")
    assert report["totals"]["buffers"] == 2 * (1 << 40)
    assert report["totals"]["params"] == 4 * 4 + 4


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_grouped_mm"),
    reason="this torch has no aten._grouped_mm: transformers runs its experts in a loop "
    "over the experts routing reached, which meta cannot know (balanced routing applies to "
    "the grouped kernel)",
)
def test_cost_on_a_small_mixtral_counts_balanced_routing() -> None:
    """FLOPs of a 1-layer Mixtral on meta equal the hand count under balanced routing,
    and the report states the routing assumption."""
    dims = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
        "max_position_embeddings": 32,
    }
    args = [a for k, v in dims.items() for a in ("-k", f"{k}={v}")]
    report = invoke_json("cost", "hf:mixtral", *args, "--device", "meta")
    stated = " ".join(report["settings"]["meta_assumptions"])
    assert "balanced across experts" in stated
    t, h, i, e, k = 32, 64, 96, 4, 2  # tokens (text length = max positions), dims
    experts = 2 * t * k * (h * 2 * i + i * h)  # gate_up and down, every token k times
    router = 2 * t * h * e
    head_dim = h // 4
    qkvo = 2 * t * (h * h + 2 * h * (2 * head_dim) + h * h)
    attn = 2 * 2 * 4 * t * t * head_dim  # scores and weighted sum, 4 heads
    assert report["totals"]["flops"] == experts + router + qkvo + attn


# -- the coverage script's classes, figures and page ---------------------------------------
def _cov():  # the benchmark script as a module
    from benchmarks import hf_coverage

    return hf_coverage


def _row(name: str, ok: bool, cause: str = "", moe: bool = False) -> dict:
    return {"name": name, "ok": ok, "cause": cause, "moe": moe}


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"build": "ImportError: X requires the natten library", "package": True}, "package"),
        ({"build": "ValueError: backbone is not set", "package": False}, "cannot-build"),
        ({"build": "ok", "inputs": "forward takes s: Session"}, "inputs"),
        ({"build": "ok", "package_inputs": "ImportError: torchaudio"}, "package"),
        ({"build": "ok", "forward": "RuntimeError: split", "forward_failed": True}, "cannot-run"),
        ({"build": "ok", "forward": "ok"}, "hookcli"),
        (
            {
                "build": "ok",
                "forward": "TypeError: forward() missing 1 required positional argument: 'p'",
                "forward_failed": True,
            },
            "hookcli",
        ),
        ({"build": "ok", "forward": "not checked: 9 parameters with one layer"}, "hookcli"),
        ({"error": "reference timed out after 300 s"}, "hookcli"),
    ],
)
def test_a_failure_is_classed_by_the_plain_reference(ref: dict, expected: str) -> None:
    """hookcli failed; the class follows what plain transformers did, and a reference that
    decided nothing counts the type as hookcli's (it stays in the denominator)."""
    kind, cause = _cov().classify(_row("t", False, "exit 4: boom"), ref)
    assert kind == expected
    assert cause


def test_figures_count_reported_of_all_of_runnable_and_of_moe() -> None:
    rows = [
        {**_row("a", True, moe=True), "class": "ok", "params_match": True},
        {**_row("b", True), "class": "ok", "params_match": True},
        {**_row("c", False, moe=True), "class": "hookcli"},
        {**_row("d", False), "class": "cannot-build"},
    ]
    f = _cov().figures(rows)
    assert (f["ok"], f["types"], f["runnable"]) == (2, 4, 3)
    assert (f["moe_ok"], f["moe_runnable"]) == (1, 2)
    assert f["pct_all"] == 50 and round(f["pct_runnable"], 1) == 66.7 and f["pct_moe"] == 50


@pytest.mark.parametrize(
    ("model_type", "moe"),
    [("mixtral", True), ("qwen3_moe", True), ("deepseek_v2", True), ("llama", False)],
)
def test_moe_is_read_from_the_config(model_type: str, moe: bool) -> None:
    pytest.importorskip("transformers")
    assert _cov().is_moe(model_type) is moe


def test_reference_names_what_transformers_cannot_build() -> None:
    """Plain ``AutoModel.from_config`` on ``autoformer``'s default config raises (its
    ``prediction_length`` is unset): the reference says so, in one line."""
    pytest.importorskip("transformers")
    ref = _cov().reference("autoformer")
    assert ref["build"].startswith("ValueError") and "prediction_length" in ref["build"]
    kind, _ = _cov().classify(_row("autoformer", False, "exit 3"), ref)
    assert kind == "cannot-build"


def test_the_page_and_the_summary_are_what_the_committed_run_gives() -> None:
    """docs/hf-coverage.md and docs/models.md's block are generated from
    benchmarks/hf-coverage.json; README's coverage sentence carries the same figures."""
    cov = _cov()
    rows, meta = cov.load(ROOT / "benchmarks" / "hf-coverage.json")
    assert len(rows) == len({r["name"] for r in rows}) and all("class" in r for r in rows)
    assert (ROOT / "docs" / "hf-coverage.md").read_text() == cov.page(rows, meta)
    models = (ROOT / "docs" / "models.md").read_text()
    block = models[models.index(cov.BEGIN) + len(cov.BEGIN) : models.index(cov.END)]
    f = cov.figures(rows)
    assert block.strip() == cov.summary(f)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"{cov._pct(f['pct_all'])}% of all {f['types']} types" in readme
    assert f"{cov._pct(f['pct_runnable'])}% of the {f['runnable']}" in readme
