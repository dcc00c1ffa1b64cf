"""hookcli watch's bootstrap: loads hookcli's training monitor into a Python process.

``hookcli watch -- COMMAND`` puts this folder first on ``PYTHONPATH``, so every Python
process COMMAND starts (``python train.py``, torchrun's agent and ranks, spawned
data-loader workers) imports this file at start-up, as Python imports any
``sitecustomize``. It does nothing unless ``HOOKCLI_WATCH_CONFIG`` is set (hookcli
watch sets it) and ``HOOKCLI_WATCH`` is not ``0`` (a process, and the processes it
starts, opt out with ``HOOKCLI_WATCH=0``). It imports neither torch nor hookcli: it
adds one finder to ``sys.meta_path`` that waits for ``import torch`` and, once torch is
in, loads ``hookcli.watch.boot``, which installs the global optimizer hooks. A process
that never imports torch pays for this file only.

Then it runs the ``sitecustomize`` this one hides (the next one on ``sys.path``), so a
venv's or a distribution's own keeps working. docs/watch.md "The bootstrap".
"""

import contextlib
import os
import sys


def _hookcli_watch_arm() -> None:
    """Called once torch is imported: load the monitor; never fail the process."""
    try:
        try:
            from hookcli.watch import boot
        except ImportError:
            root = os.environ.get("HOOKCLI_WATCH_PATH")
            if not root:
                raise
            sys.path.insert(0, root)  # hookcli's own folder, only while it loads
            try:
                from hookcli.watch import boot
            finally:
                if root in sys.path:
                    sys.path.remove(root)
        boot.arm()
    except Exception as err:  # the training runs on, unwatched
        sys.stderr.write(
            f"hookcli watch: the monitor did not load in process {os.getpid()} "
            f"({type(err).__name__}: {err}); this process runs unwatched\n"
        )


class _HookcliWatchFinder:
    """A ``sys.meta_path`` finder that runs ``_hookcli_watch_arm`` right after torch's
    own ``__init__`` has run; it finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        if self in sys.meta_path:  # one shot: torch is imported once
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_arm(module):
            exec_module(module)
            _hookcli_watch_arm()

        loader.exec_module = exec_and_arm
        return spec


def _hookcli_watch_whole_lines() -> None:
    """Every process of the run writes into the one stderr of ``hookcli watch`` (its
    stdout too): each of its lines goes out in one write, so no other rank's output
    lands inside it. Python's stdout is block-buffered in a pipe or a file (an 8 KiB
    block ends mid-line), and under ``-u``/``PYTHONUNBUFFERED`` each piece of a
    ``print`` is a write of its own; line buffering without write-through gives one
    write per line (and per ``\r``, as a progress bar redraws)."""
    import io

    for stream in (sys.stdout, sys.stderr):
        if type(stream) is io.TextIOWrapper and not (
            stream.line_buffering and not stream.write_through
        ):
            with contextlib.suppress(Exception):
                stream.reconfigure(line_buffering=True, write_through=False)


def _hookcli_watch_install() -> None:
    if not os.environ.get("HOOKCLI_WATCH_CONFIG") or os.environ.get("HOOKCLI_WATCH") == "0":
        return
    _hookcli_watch_whole_lines()
    if "torch" in sys.modules:  # cannot happen at start-up; armed by hand then
        _hookcli_watch_arm()
        return
    sys.meta_path.insert(0, _HookcliWatchFinder())


def _hookcli_watch_chain() -> None:
    """Run the ``sitecustomize`` that this one hides, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_hookcli_watch_install()
_hookcli_watch_chain()
