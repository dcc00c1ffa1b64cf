"""``hookcli watch`` without the Typer app, so COMMAND starts sooner.

The whole run is what a watched training costs its user, and building the Typer app
(typer, every command module) takes about 0.1 s before COMMAND could start: a few per
cent of a short run. ``hookcli.entry`` hands ``watch`` command lines here first. This
parser takes exactly the options of ``hookcli watch`` (``--opt VALUE``, ``--opt=VALUE``,
flags), as Click would parse them; anything else (``--help``, an unknown or repeated
flag's other spellings, a value it cannot convert, no COMMAND, a ``[tool.hookcli]``
table that may hold defaults) returns None, and the full CLI runs and says what is
wrong. Both paths call the same ``hookcli.watch.command.cli_command``
(tests/test_watch.py checks that they agree).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

_VALUES = {
    "--every": "every",
    "--fail-on": "fail_on",
    "--stop-on": "stop_on",
    "--min-grad-norm": "min_grad_norm",
    "--max-grad-norm": "max_grad_norm",
    "--max-update-ratio": "max_update_ratio",
    "--out": "out",
    "--plot": "plot",
    "--tensorboard": "tensorboard",
    "--format": "format",
    "-f": "format",
    "--output": "output",
    "-o": "output",
}
_FLAGS = {"--nan-origin": "nan_origin", "--debug": "debug"}
_FLOATS = ("min_grad_norm", "max_grad_norm", "max_update_ratio")
_PATHS = ("out", "plot", "tensorboard", "output")


def parse(argv: list[str]) -> dict[str, Any] | None:
    """``watch``'s arguments -> ``cli_command``'s keywords, or None (the full CLI then)."""
    from hookcli.formats import Format

    raw: dict[str, Any] = {}
    command: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            command = argv[i + 1 :]
            break
        if not arg.startswith("-") or arg == "-":
            command = argv[i:]
            break
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _FLAGS and not eq:
            raw[_FLAGS[name]] = True
        elif name in _VALUES:
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            raw[_VALUES[name]] = value
        else:
            return None
        i += 1
    if not command:
        return None
    from hookcli.watch.config import DEFAULT_EVERY

    out: dict[str, Any] = {
        "cmd": command,
        "every": DEFAULT_EVERY,
        "nan_origin": bool(raw.get("nan_origin")),
        "fail_on": raw.get("fail_on"),
        "stop_on": raw.get("stop_on"),
        "debug": bool(raw.get("debug")),
        "format": Format.TABLE,
    }
    try:
        if "every" in raw:
            out["every"] = int(raw["every"])
            if out["every"] < 1:
                return None
        for key in _FLOATS:
            out[key] = None
            if key in raw:
                out[key] = float(raw[key])
                if math.isnan(out[key]) or out[key] < 0:
                    return None
        if "format" in raw:
            out["format"] = Format(raw["format"])
    except ValueError:
        return None
    for key in _PATHS:  # every path as typed ('' is refused by name, '-' is stdout)
        out[key] = raw.get(key)
    return out


def _may_hold_table(text: bytes) -> bool:
    """Whether a pyproject.toml's bytes may hold ``[tool.hookcli]``: the key ``tool``
    then ``hookcli`` under it (a table header, a dotted key, quoted or spaced), a
    ``[tool]`` table or a ``tool = {...}`` inline table, whose keys only a parser reads.
    False only where none can be: then the TOML parser is not loaded before COMMAND."""
    import re

    q = rb"[\"']?"  # a key may be bare, "quoted" or 'quoted'
    return any(
        re.search(pattern, text, re.MULTILINE)
        for pattern in (
            rb"tool" + q + rb"\s*\.\s*" + q + rb"hookcli",  # [tool.hookcli], tool.hookcli.x =
            rb"^\s*\[\s*" + q + rb"tool" + q + rb"\s*\]",  # [tool]
            rb"^\s*" + q + rb"tool" + q + rb"\s*=",  # tool = { hookcli = ... }
        )
    )


def _configured() -> bool:
    """Whether a ``[tool.hookcli]`` table may give defaults (the full CLI reads it)."""
    if os.environ.get("HOOKCLI_NO_CONFIG", "") not in ("", "0"):
        return False
    from hookcli.config import find_pyproject, read_table

    try:
        found = find_pyproject(Path.cwd())
        if found is None or not _may_hold_table(found.read_bytes()):
            return False  # no table of ours in it: no TOML parser to load
        return bool(read_table(found))
    except Exception:
        return True


def main(argv: list[str]) -> None:
    """Run ``hookcli watch ARGV`` and exit, or return when the full CLI should."""
    if _configured():
        return
    options = parse(argv)
    if options is None:
        return
    from hookcli.errors import HookcliError, printable
    from hookcli.streams import model_output_to_stderr

    code = 0
    try:
        from hookcli.watch.command import cli_command  # checks every path first

        with model_output_to_stderr():
            code = cli_command(**options)
    except HookcliError as err:
        if options["debug"]:
            import traceback

            traceback.print_exc()
        print(f"hookcli: error: {printable(err.message)}", file=sys.stderr, flush=True)
        code = err.exit_code
    except KeyboardInterrupt:
        print("hookcli: interrupted", file=sys.stderr, flush=True)
        code = 130
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if "torch" in sys.modules:  # --tensorboard: skip torch's slow interpreter teardown
        os._exit(code)
    sys.exit(code)
