"""Coverage on meta: every transformers ``AutoModel`` type (or every timm model) at full
default size, ``hookcli inspect MODEL --device meta -d 1``, one forked child per model
with a timeout and an address-space cap.

For each model it prints ``ok`` or ``failed`` with a one-line cause (the
``hookcli: error:`` line, or the timeout / signal), the child's peak RSS, and for
every ok model whether the parameter count equals plain
``with torch.device("meta"): AutoModel.from_config(AutoConfig.for_model(t))``
(timm: ``timm.create_model(name)`` under the same context).

    python benchmarks/hf_coverage.py                 # every AutoModel type
    python benchmarks/hf_coverage.py --source timm   # every timm model
    python benchmarks/hf_coverage.py --every 10      # a sample: every 10th name

The children fork from a parent that has imported torch, transformers and hookcli
once, so a model costs its build and its run, not the imports.

transformers types get one class each (``CLASSES``), decided by a reference run of plain
transformers for every type hookcli did not report (``classify``), in another capped
child: whether ``AutoModel.from_config(AutoConfig.for_model(t))`` builds under
``torch.device("meta")``, and whether the built model's forward runs on the CPU, with
the inputs hookcli derives from the config (at the default config where it holds at
most ``CPU_PARAMS`` parameters, else with every layer count set to 1, per-layer lists
cut to their first entry and as many experts as a token picks (at least 2), the widths
kept; beyond ``CPU_PARAMS_REDUCED`` parameters
even then, not checked).
``OVERRIDES`` holds the few types a program cannot decide, each with why. A type is
MoE when its config (or a sub-config) has more than one expert (``MOE_KEYS``) or its
name says ``moe``.

    python benchmarks/hf_coverage.py --json rows.json   # run, classify, keep the rows
    python benchmarks/hf_coverage.py --from-json rows.json --page docs/hf-coverage.md
        # classify the rows that have no class yet, then write the page and the summary
        # block of docs/models.md from them
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# hookcli's CLI guards os._exit for the rest of the process (a model calling it is an
# error); the child ends itself with the real one
_REAL_EXIT = os._exit


def hf_names() -> list[str]:
    """Every model type with an AutoModel class in the installed transformers."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(MODEL_MAPPING_NAMES)


def timm_names() -> list[str]:
    import timm

    return sorted(timm.list_models())


def plain_params(source: str, name: str) -> int:
    """The reference: the model built by its library alone on meta."""
    import torch

    with torch.device("meta"):
        if source == "hf":
            import transformers as tf

            model = tf.AutoModel.from_config(tf.AutoConfig.for_model(name))
        else:
            import timm

            model = timm.create_model(name, pretrained=False)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def child(source: str, name: str, work: Path, mem_bytes: int) -> None:
    """In the forked child: the hookcli run, then the reference count; never returns."""
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    err = os.open(work / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    out = os.open(os.devnull, os.O_WRONLY)
    os.dup2(err, 2)
    os.dup2(out, 1)
    from hookcli.cli import main

    spec = f"{source}:{name}"
    argv = ["inspect", spec, "--device", "meta", "-d", "1", "--format", "json"]
    argv += ["-o", str(work / "report.json")]
    sys.argv = ["hookcli", *argv]
    code = 1
    try:
        main()  # HOOKCLI_FULL_EXIT=1: it ends with SystemExit, not os._exit
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException as e:
        print(f"hookcli: error: coverage child: {type(e).__name__}: {e}", file=sys.stderr)
        code = 99
    sys.stderr.flush()
    if code == 0:
        try:
            (work / "plain").write_text(str(plain_params(source, name)))
        except BaseException as e:  # the reference itself failed
            (work / "plain").write_text(f"error: {type(e).__name__}: {str(e)[:120]}")
    _REAL_EXIT(code)


def cause(work: Path) -> str:
    """The one-line cause: hookcli's error line, else the last line on stderr."""
    try:
        lines = (work / "stderr").read_text(errors="replace").splitlines()
    except OSError:
        return "no output"
    errors = [ln for ln in lines if ln.startswith("hookcli: error:")]
    line = errors[-1] if errors else next((ln for ln in reversed(lines) if ln.strip()), "")
    return line.removeprefix("hookcli: error: ").strip()[:300]


def run_one(source: str, name: str, timeout: float, mem_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hookcli-cov-") as tmp:
        work = Path(tmp)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(source, name, work, mem_bytes)
        status = None
        usage = None
        while time.monotonic() - start < timeout:
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return {
                "name": name,
                "ok": False,
                "cause": f"timeout after {timeout:.0f} s",
                "seconds": timeout,
                "rss_mib": usage.ru_maxrss / 1024,
            }
        seconds = time.monotonic() - start
        rss = usage.ru_maxrss / 1024 if usage else 0.0
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            return {
                "name": name,
                "ok": False,
                "cause": f"killed by {sig}",
                "seconds": seconds,
                "rss_mib": rss,
            }
        code = os.WEXITSTATUS(status)
        row: dict[str, Any] = {
            "name": name,
            "ok": code == 0,
            "exit": code,
            "seconds": seconds,
            "rss_mib": rss,
        }
        if code != 0:
            row["cause"] = f"exit {code}: {cause(work)}"
            return row
        report = json.loads((work / "report.json").read_text())
        row["params"] = int(report["totals"]["params"])
        plain = (work / "plain").read_text() if (work / "plain").exists() else "missing"
        row["plain_params"] = int(plain) if plain.isdigit() else plain
        row["params_match"] = row["params"] == row["plain_params"]
        row["assumptions"] = report["settings"].get("meta_assumptions", [])
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=["hf", "timm"], default="hf")
    ap.add_argument("--every", type=int, default=1, help="every Nth name (a sample)")
    ap.add_argument("--offset", type=int, default=0, help="start at this index")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per model")
    ap.add_argument("--mem-gib", type=float, default=8.0, help="address-space cap per child")
    ap.add_argument("--json", type=Path, help="also write every row here")
    ap.add_argument("--no-classify", action="store_true", help="no plain-transformers reference")
    ap.add_argument("--from-json", type=Path, help="no run: classify and publish these rows")
    ap.add_argument("--page", type=Path, help="write the coverage page here (hf, the full list)")
    ap.add_argument(
        "--summary", type=Path, default=ROOT / "docs" / "models.md", help="page with the block"
    )
    ap.add_argument("names", nargs="*", help="only these names")
    args = ap.parse_args(argv)
    mem = int(args.mem_gib * (1 << 30))
    if args.from_json:
        return publish(args, mem)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HOOKCLI_FULL_EXIT", "1")
    import torch  # noqa: F401  (imported once, before the forks)

    import hookcli.cli  # noqa: F401

    if args.source == "hf":
        import transformers  # noqa: F401

        everything = hf_names()
    else:
        import timm  # noqa: F401

        everything = timm_names()
    names = args.names or everything[args.offset :: args.every]
    sample = "all" if len(names) == len(everything) else f"{len(names)} of {len(everything)}"
    print(
        f"# {args.source}: {sample} names, timeout {args.timeout:.0f} s, cap {args.mem_gib} GiB",
        flush=True,
    )
    rows = []
    for name in names:
        row = run_one(args.source, name, args.timeout, int(args.mem_gib * (1 << 30)))
        rows.append(row)
        if row["ok"]:
            match = (
                "params match"
                if row.get("params_match")
                else (f"PARAMS DIFFER: hookcli {row['params']:,} vs plain {row['plain_params']}")
            )
            stand_ins = len(row["assumptions"])
            note = f" (value stand-ins of {stand_ins} kinds)" if stand_ins else ""
            print(
                f"ok      {name}: {match}{note}; {row['seconds']:.1f} s, {row['rss_mib']:.0f} MiB",
                flush=True,
            )
        else:
            print(f"failed  {name}: {row['cause']}", flush=True)
    ok = sum(r["ok"] for r in rows)
    match = sum(bool(r.get("params_match")) for r in rows)
    peak = max((r["rss_mib"] for r in rows), default=0.0)
    print(
        f"# {ok}/{len(rows)} reported ({100 * ok / max(len(rows), 1):.1f}%); "
        f"params equal plain {args.source} on {match}/{ok}; peak child RSS {peak:.0f} MiB"
    )
    causes = Counter(_group(r["cause"]) for r in rows if not r["ok"])
    for text, n in causes.most_common():
        print(f"#   {n:3d}  {text}")
    if args.source == "hf" and not args.no_classify:
        classify_rows(rows, args.timeout, mem)
        report(rows)
    if args.json:
        save(args.json, rows)
    if args.page:
        write_page(args, rows, versions())
    return 0


def save(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"versions": versions(), "rows": rows}, indent=1) + "\n")


def load(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Rows from ``--json`` (an older run's file is a bare list)."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return data, None
    return list(data["rows"]), data.get("versions")


def report(rows: list[dict[str, Any]]) -> None:
    f = figures(rows)
    print(f"# {summary(f)}".replace("**", ""))
    for key, label in CLASSES.items():
        print(f"#   {f['by_class'].get(key, 0):3d}  {label}")


def write_page(args: argparse.Namespace, rows: list[dict[str, Any]], names: str) -> None:
    args.page.write_text(page(rows, names))
    write_summary(args.summary, summary(figures(rows)))
    print(f"# wrote {args.page} and the summary block of {args.summary}")


def publish(args: argparse.Namespace, mem: int) -> int:
    """``--from-json``: classify the rows that lack a class (and save them back), then
    print the figures and, with ``--page``, write the page and the summary block."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch  # noqa: F401  (imported once, before the forks)
    import transformers  # noqa: F401

    import hookcli.sources.hf  # noqa: F401

    rows, names = load(args.from_json)
    if any("class" not in r for r in rows):
        classify_rows(rows, args.timeout, mem)
        save(args.from_json, rows)
        names = versions()
    report(rows)
    if args.page:
        write_page(args, rows, names or versions())
    return 0


def _group(text: str) -> str:
    """A failure's cause with names and numbers taken out, to group like causes."""
    import re

    text = re.sub(r"forward failed in \S+ \(\S+\) with input shapes .*?: ", "forward: ", text)
    text = re.sub(r"\d[\d,.]*", "N", text)
    return text[:110]


# -- classes -------------------------------------------------------------------------------
# class -> how the page names it
CLASSES = {
    "ok": "reported",
    "hookcli": "hookcli failed",
    "cannot-build": "transformers cannot build its default config",
    "cannot-run": "transformers cannot run its default config",
    "package": "needs a package that is not installed",
    "inputs": "needs inputs no default can give",
}
# classes of the types plain transformers builds and runs: the target's denominator
RUNNABLE = ("ok", "hookcli")
# a type is MoE where one of these (in its config or a sub-config) is above 1
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# the reference forward runs the default config where it has at most this many
# parameters, else with every layer count set to 1 (the widths kept)
CPU_PARAMS = 400_000_000
CPU_PARAMS_REDUCED = 1_200_000_000  # beyond this even with one layer: not checked
# config fields holding a layer count (set to 1 for the reduced reference)
_LAYER_KEY = re.compile(
    r"^(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|"
    r"num_encoder_layers|num_decoder_layers|depth|num_blocks)$"
)
# what a program cannot decide: type -> (class, why); each entry checked by hand
OVERRIDES: dict[str, tuple[str, str]] = {}
_PACKAGE = re.compile(
    r"No module named|requires? the \S+ librar|pip install|is not installed|"
    r"could not be found in your environment|requires? .{0,40}(torchaudio|detectron2|natten)",
    re.IGNORECASE,
)


# a plain forward refusing hookcli's inputs for want of an argument: hookcli's to give
_MISSING = re.compile(r"missing \d+ required (positional|keyword)")


def is_moe(name: str) -> bool:
    """MoE: ``moe`` in the type's name, or more than one expert in its config."""
    if "moe" in name.lower():
        return True
    try:
        import transformers as tf

        config = tf.AutoConfig.for_model(name)
    except Exception:
        return False
    from hookcli.sources import hf

    for cfg in hf._configs(config):
        for key in MOE_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return True
    return False


def _error(err: BaseException) -> str:
    """One line: the type and the first line of the message, without this machine's paths."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = re.sub(r"/\S*/site-packages/", "", lines[0] if lines else "")
    return f"{type(err).__name__}: {text}"[:300]


def _reduced(config: Any) -> Any:
    """A copy of ``config`` with every layer count (sub-configs too) set to 1."""
    import copy

    from hookcli.sources import hf

    small = copy.deepcopy(config)
    for cfg in hf._configs(small):
        counts = set()
        top_k = getattr(cfg, "num_experts_per_tok", None)
        few = max(2, top_k if isinstance(top_k, int) else 2)
        for key, value in list(vars(cfg).items()):
            if _LAYER_KEY.match(key) and isinstance(value, int) and value > 1:
                setattr(cfg, key, 1)
                counts.add(value)
            elif key in MOE_KEYS and isinstance(value, int) and value > few:
                setattr(cfg, key, few)  # as many experts as a token picks (at least 2)
        for key, value in list(vars(cfg).items()):
            # per-layer lists (``layer_types``) as long as a count: their first entry
            if isinstance(value, list) and len(value) in counts:
                setattr(cfg, key, value[:1])
    return small


def _count(model: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _materialize(specs: tuple[str, ...], values: dict[str, Any]) -> tuple[list, dict]:
    """hookcli's SPEC texts as CPU tensors (values where hookcli gave them)."""
    import torch

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    g = torch.Generator().manual_seed(0)
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if not sep:
            name, rest = "", spec
        if name in values:
            kwargs[name] = values[name]
            continue
        parts = rest.split(":")
        dims_at = next(i for i, p in enumerate(parts) if re.fullmatch(r"\d+(x\d+)*", p))
        dims = [int(d) for d in parts[dims_at].split("x")]
        dtype = getattr(torch, parts[0]) if dims_at == 1 else torch.float32
        if dtype.is_floating_point:
            value = torch.randn(dims, generator=g, dtype=dtype)
        else:
            low, _, high = (parts[dims_at + 1] if len(parts) > dims_at + 1 else "0..2").partition(
                ".."
            )
            value = torch.randint(int(low), int(high), dims, generator=g, dtype=dtype)
        if name:
            kwargs[name] = value
        else:
            args.append(value)
    return args, kwargs


def _object_input(model: Any) -> str | None:
    """The first required forward argument annotated with a class that is not a tensor
    (an inference session), as ``name: Class``; None where there is none."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    for p in params:
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation
        if isinstance(ann, type) and not issubclass(ann, (int, float, bool, str)):
            import torch

            if not issubclass(ann, torch.Tensor):
                return f"{p.name}: {ann.__name__}"
    return None


def _processor_error(config: Any) -> str | None:
    """The error of building transformers' default feature extractor / image processor
    for this type, where it fails for want of a package."""
    from transformers.models.auto import feature_extraction_auto as fa
    from transformers.models.auto import image_processing_auto as ia

    parts = str(getattr(config, "model_type", "")).split("_")
    for mapping, load in (
        (fa.FEATURE_EXTRACTOR_MAPPING_NAMES, fa.feature_extractor_class_from_name),
        (ia.IMAGE_PROCESSOR_MAPPING_NAMES, ia.get_image_processor_class_from_name),
    ):
        # the type's own entry, else its family's (``fun_asr_nano`` for ``_encoder``)
        keys = ("_".join(parts[:n]) for n in range(len(parts), 0, -1))
        entry = next((mapping[k] for k in keys if k in mapping), None)
        if isinstance(entry, dict):
            entry = entry.get("torchvision") or entry.get("pil")
        if not isinstance(entry, str):
            continue
        try:
            load(entry)()
        except Exception as err:
            if _PACKAGE.search(str(err)) or isinstance(err, ImportError):
                return _error(err)
    return None


def reference(name: str) -> dict[str, Any]:
    """Plain transformers on ``name``'s default config: the build on meta, then a forward
    on the CPU with the inputs hookcli derives (see the module docstring)."""
    import torch
    import transformers as tf

    from hookcli.sources import hf

    tf.logging.set_verbosity_error()
    out: dict[str, Any] = {}
    try:
        config = tf.AutoConfig.for_model(name)
        with torch.device("meta"):
            meta = tf.AutoModel.from_config(config)
    except BaseException as err:
        out["build"] = _error(err)
        out["package"] = bool(_PACKAGE.search(str(err))) or isinstance(err, ImportError)
        return out
    out["build"] = "ok"
    out["params"] = _count(meta)
    del meta
    if hasattr(config, "use_cache"):
        config.use_cache = False  # as hookcli builds it
    if out["params"] > CPU_PARAMS:
        config = _reduced(config)
        try:
            with torch.device("meta"):
                params = _count(tf.AutoModel.from_config(config))
        except BaseException as err:
            out["forward"] = f"not checked: the one-layer build failed: {_error(err)}"
            return out
        out["reduced"] = params
        if params > CPU_PARAMS_REDUCED:
            out["forward"] = f"not checked: {params:,} parameters with one layer"
            return out
    torch.manual_seed(0)
    try:
        model = tf.AutoModel.from_config(config).eval()
    except BaseException as err:
        out["forward"] = f"not checked: the CPU build failed: {_error(err)}"
        return out
    if type(model).forward is torch.nn.Module.forward:
        out["forward"] = f"{type(model).__name__} has no forward (nn.Module's own raises)"
        out["forward_failed"] = True
        return out
    specs, values = hf.default_inputs(model, config)
    if not specs:
        held = _object_input(model)
        package = _processor_error(config)
        if held is not None:
            out["inputs"] = f"forward takes {held}, an object no default can give"
        elif package is not None:
            out["package_inputs"] = package
        out["forward"] = "not checked: no input"
        return out
    args, kwargs = _materialize(specs, values)
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except BaseException as err:
        out["forward"] = _error(err)
        out["forward_failed"] = True
        return out
    out["forward"] = "ok"
    return out


def reference_child(name: str, work: Path, mem_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    err = os.open(work / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    code = 0
    try:
        (work / "ref.json").write_text(json.dumps(reference(name)))
    except BaseException as e:
        (work / "ref.json").write_text(json.dumps({"error": _error(e)}))
        code = 1
    _REAL_EXIT(code)


def run_reference(name: str, timeout: float, mem_bytes: int) -> dict[str, Any]:
    """``reference`` in a forked child under the same cap; a timeout or a signal says so."""
    with tempfile.TemporaryDirectory(prefix="hookcli-ref-") as tmp:
        work = Path(tmp)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            reference_child(name, work, mem_bytes)
        while time.monotonic() - start < timeout:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"error": f"reference timed out after {timeout:.0f} s"}
        if os.WIFSIGNALED(status):
            return {"error": f"reference killed by {signal.Signals(os.WTERMSIG(status)).name}"}
        try:
            return dict(json.loads((work / "ref.json").read_text()))
        except (OSError, ValueError):
            return {"error": "reference wrote nothing"}


def classify(row: dict[str, Any], ref: dict[str, Any] | None) -> tuple[str, str]:
    """(class, one-line cause) of a row, from hookcli's result and the plain reference."""
    name = row["name"]
    if name in OVERRIDES:
        return OVERRIDES[name]
    if row["ok"]:
        return "ok", ""
    hookcli_cause = row.get("cause", "")
    if ref is None or "error" in ref:
        why = ref["error"] if ref else "no reference run"
        return "hookcli", f"{hookcli_cause} (undecided: {why})"
    if ref.get("build") != "ok":
        kind = "package" if ref.get("package") else "cannot-build"
        return kind, f"AutoModel.from_config on meta: {ref['build']}"
    if "inputs" in ref:
        return "inputs", ref["inputs"]
    if "package_inputs" in ref:
        return "package", f"its default processor: {ref['package_inputs']}"
    if ref.get("forward_failed") and _MISSING.search(str(ref.get("forward"))):
        # forward wants an argument hookcli's inputs leave out: hookcli's rule is short
        return "hookcli", f"{hookcli_cause} (plain forward: {ref['forward']})"
    if ref.get("forward_failed"):
        where = "one layer, " if "reduced" in ref else ""
        return "cannot-run", f"plain forward on the CPU ({where}hookcli's inputs): {ref['forward']}"
    if str(ref.get("forward", "")).startswith("not checked"):
        return "hookcli", f"{hookcli_cause} (undecided: reference {ref['forward']})"
    return "hookcli", hookcli_cause


def classify_rows(
    rows: list[dict[str, Any]], timeout: float, mem_bytes: int, log: bool = True
) -> None:
    """Give every row without one its class, cause and MoE flag (in place)."""
    for row in rows:
        if "moe" not in row:
            row["moe"] = is_moe(row["name"])
        if "class" in row:
            continue
        ref = None if row["ok"] else run_reference(row["name"], timeout, mem_bytes)
        if ref is not None:
            row["reference"] = ref
        row["class"], row["class_cause"] = classify(row, ref)
        if log and not row["ok"]:
            print(f"class   {row['name']}: {row['class']}: {row['class_cause'][:200]}", flush=True)


# -- figures and the page -----------------------------------------------------------------
def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The full-list figures: reported of all, of the runnable types, and of the MoE ones."""
    by_class = Counter(r["class"] for r in rows)
    runnable = [r for r in rows if r["class"] in RUNNABLE]
    moe = [r for r in runnable if r.get("moe")]
    ok = by_class["ok"]
    return {
        "types": len(rows),
        "ok": ok,
        "runnable": len(runnable),
        "moe_runnable": len(moe),
        "moe_ok": sum(r["class"] == "ok" for r in moe),
        "by_class": dict(by_class),
        "pct_all": 100 * ok / max(len(rows), 1),
        "pct_runnable": 100 * ok / max(len(runnable), 1),
        "pct_moe": 100 * sum(r["class"] == "ok" for r in moe) / max(len(moe), 1),
        "params_match": sum(bool(r.get("params_match")) for r in rows),
    }


def _pct(x: float) -> str:
    text = f"{x:.1f}"
    return text.removesuffix(".0") if text.endswith(".0") else text


def summary(f: dict[str, Any]) -> str:
    """The summary paragraph (docs/models.md's block and the page's first lines)."""
    return (
        f"**{f['ok']} of {f['types']} types report ({_pct(f['pct_all'])}% of all), "
        f"{f['ok']} of the {f['runnable']} that plain transformers builds and runs "
        f"({_pct(f['pct_runnable'])}%)**; MoE: {f['moe_ok']} of the {f['moe_runnable']} "
        f"runnable MoE types ({_pct(f['pct_moe'])}%). Every reported type has the parameter "
        f"count of plain transformers: {f['params_match']} of {f['ok']}."
    )


def page(rows: list[dict[str, Any]], versions: str) -> str:
    """docs/hf-coverage.md: the figures, the classes, and every failure with its cause."""
    f = figures(rows)
    lines = [
        "# transformers coverage on meta: the full list",
        "",
        "<!-- generated by benchmarks/hf_coverage.py --from-json benchmarks/hf-coverage.json"
        " --page docs/hf-coverage.md; do not edit by hand -->",
        "",
        f"`hookcli inspect hf:TYPE --device meta -d 1` on every `AutoModel` type of {versions}, "
        "at full default size, one forked child per type (300 s, 8 GiB address space). "
        "How it is run and how each type is classed: "
        "[models](models.md#coverage-on-meta).",
        "",
        summary(f),
        "",
        "| class | types |",
        "|---|---|",
    ]
    for key, label in CLASSES.items():
        lines.append(f"| {label} | {f['by_class'].get(key, 0)} |")
    lines += ["", "## Every type that did not report", ""]
    lines += ["| type | MoE | class | cause |", "|---|---|---|---|"]
    order = list(CLASSES)
    failed = sorted(
        (r for r in rows if r["class"] != "ok"), key=lambda r: (order.index(r["class"]), r["name"])
    )
    for r in failed:
        cause = " ".join(str(r.get("class_cause") or r.get("cause", "")).split())
        cause = re.sub(r"/\S*/site-packages/", "", cause)
        cause = cause.replace("|", "\\|")[:240]
        lines.append(
            f"| `{r['name']}` | {'yes' if r.get('moe') else ''} | {CLASSES[r['class']]} | {cause} |"
        )
    if OVERRIDES:
        lines += ["", "Decided by hand (`OVERRIDES` in the script):", ""]
        lines += [f"- `{n}`: {CLASSES[c]}: {why}" for n, (c, why) in sorted(OVERRIDES.items())]
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- hf-coverage:begin -->", "<!-- hf-coverage:end -->"


def write_summary(path: Path, text: str) -> None:
    """Replace the block between BEGIN and END in ``path`` with ``text``."""
    doc = path.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    path.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])


def versions() -> str:
    import torch
    import transformers

    return f"transformers {transformers.__version__} (torch {torch.__version__.split('+')[0]})"


if __name__ == "__main__":
    raise SystemExit(main())
