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
"""

from __future__ import annotations

import argparse
import json
import os
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
    ap.add_argument("names", nargs="*", help="only these names")
    args = ap.parse_args(argv)

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
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _group(text: str) -> str:
    """A failure's cause with names and numbers taken out, to group like causes."""
    import re

    text = re.sub(r"forward failed in \S+ \(\S+\) with input shapes .*?: ", "forward: ", text)
    text = re.sub(r"\d[\d,.]*", "N", text)
    return text[:110]


if __name__ == "__main__":
    raise SystemExit(main())
