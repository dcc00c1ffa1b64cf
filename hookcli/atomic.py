"""Files hookcli writes (``--output``, ``features --out``/``--png``): checked early, written
atomically.

A file is written to a hidden temp file in its own folder, then renamed into place,
so a reader never sees half a report and an interrupted write leaves the previous
file untouched. Every temp file in flight is recorded, so the CLI can remove it even
when a signal lands between its creation and the ``finally`` that would remove it.
No torch import here: ``check_target`` runs before the model is built.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from hookcli.errors import UsageError

# Temp files created and not yet renamed or removed (paths as str).
_PENDING: set[str] = set()
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def is_stdout(path: Path | str | None) -> bool:
    """``-o -`` (or no ``-o``) means stdout."""
    return path is None or str(path) == "-"


def check_target(path: Path, option: str) -> None:
    """Exit 2 now, before any work, when ``path`` cannot be written.

    A folder, a path under a regular file, a read-only file, or a folder where no file
    can be created are refused, and so is ``-``: stdout carries the report (``-o -`` is
    the one option that means stdout, and ``preflight`` takes it before this check).
    Missing parent folders are fine: they are created when the file is written. A device
    or a pipe (``/dev/null``) is written into, so it only has to be writable; a symlink
    is written through, so its target's folder is the one probed.
    """
    if str(path) == "-":
        raise UsageError(
            f"{option} -: stdout carries the report, so '-' is not taken as stdout here; "
            "give a file name"
        )
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name")
    if path.exists() and not _mode_bits(path) & 0o222:
        # The mode bits, not os.access: root (the usual CI container) may write anything,
        # but a file marked read-only (chmod 444) is meant to stay as it is.
        raise UsageError(f"{option} {path}: the file is read-only (no write permission bits)")
    if _special(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: cannot write to it (permission denied)")
        return
    _probe(_through_link(path).absolute().parent, path, option)


def check_folder(path: Path, option: str) -> None:
    """Exit 2 now when ``path`` cannot be a folder hookcli writes files into (``watch
    --out``, ``--tensorboard``): a file, a path under a file, a folder where no file can
    be created (read-only, ``/proc``). Missing folders are fine: they are created."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is a file; give a folder")
    _probe(path.absolute(), path, option)


def _probe(folder: Path, path: Path, option: str) -> None:
    """Create (and remove) a file in ``folder``, or the nearest folder above it that
    exists: exit 2 naming ``option`` and ``path`` where that fails."""
    while not folder.exists():  # the nearest folder that exists decides
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: {folder} is not a folder")
    import tempfile  # not at import: hookcli watch checks paths before COMMAND starts

    try:  # a real try: os.access says yes to root on a read-only mount or in /proc
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hookcli-probe.", suffix=".tmp")
    except OSError as err:
        why = err.strerror or str(err)
        raise UsageError(f"{option} {path}: cannot create files in {folder} ({why})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_distinct(targets: Iterable[tuple[str, Path | None]]) -> None:
    """Exit 2 when two options name one file (``--trace-out r.json -o r.json``): the
    second write would silently replace the first. Paths are compared after resolving
    symlinks, and by inode when both exist (a hard link)."""
    seen: list[tuple[str, Path]] = []
    for option, path in targets:
        if path is None:
            continue
        for other_option, other in seen:
            if same_file(path, other):
                raise UsageError(
                    f"{other_option} {other} and {option} {path} name the same file: "
                    "give each output its own path"
                )
        seen.append((option, path))


def check_not_inputs(
    targets: Iterable[tuple[str, Path | None]], inputs: Iterable[tuple[str, Path]]
) -> None:
    """Exit 2 when an output names a file the run reads (``-o model.py`` with MODEL
    ``model.py:Net``): writing the report would replace the user's file."""
    reads = list(inputs)
    for option, path in targets:
        if path is None:
            continue
        for read_option, read in reads:
            if same_file(path, read):
                label = (
                    f"{read_option}{read}"
                    if read_option.endswith("=")
                    else (f"{read_option} {read}")
                )
                raise UsageError(
                    f"{option} {path} is {label}, a file this run reads: writing the output "
                    "there would replace it; give the output its own path"
                )


def same_file(a: Path, b: Path) -> bool:
    """The same file: equal after resolving symlinks, or one inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP for a few instructions, so a temp file is never left
    unrecorded."""
    held = False
    with contextlib.suppress(ValueError, OSError, AttributeError):  # not the main thread
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        held = True
    try:
        yield
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


# Names of file descriptor 1. While a command runs, fd 1 is routed to stderr (so that
# what the model prints stays out of the report): opening one of these would land the
# report on stderr. They mean the stdout the report goes to, like ``-o -``.
_STDOUT_NAMES = frozenset({"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


def _write_report_stdout(write: Callable[[IO[bytes]], object], label: str) -> None:
    """``write`` into the stdout the report goes to (bytes, through its buffer)."""
    from hookcli.streams import report_stream

    stream = report_stream()
    try:
        stream.flush()
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # a text-only stream (tests' StringIO): decode what is written
            data = io.BytesIO()
            write(data)
            stream.write(data.getvalue().decode("utf-8", errors="replace"))
        else:
            write(buffer)
            buffer.flush()
    except BrokenPipeError:
        return  # the reader stopped early (| head): not an error
    except OSError as err:
        raise UsageError(f"cannot write {label}: {err.strerror or err}") from err


def _special(path: Path) -> bool:
    """An existing file that is not a regular file or a folder: a device, a pipe, a socket
    (``/dev/null``, ``/dev/stdout``). A rename would replace the node itself."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _through_link(path: Path) -> Path:
    """The path a write lands on: a symlink's target (the link stays a link), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _mode_bits(path: Path) -> int:
    """The permission bits of an existing file (0o777 when they cannot be read)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o777


def _new_mode(path: Path) -> int:
    """The mode the written file gets: an existing file keeps its own (as ``>`` does), a
    new one gets the usual 0666 less the umask."""
    try:
        st = os.stat(path)
    except OSError:
        return 0o666 & ~_umask()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], option: str = "") -> None:
    """Write ``path`` through a temp file in its folder, then rename it into place.

    A failure, Ctrl-C, SIGTERM or SIGHUP midway leaves any previous file untouched and no
    temp file behind. An OS error is exit 2 naming the file (``option`` names the flag).
    """
    label = f"{option} {path}" if option else str(path)
    if str(path) in _STDOUT_NAMES:
        _write_report_stdout(write, label)
        return
    if _special(path):  # /dev/null, a pipe: written into, never renamed over
        try:
            with open(path, "wb") as f:
                write(f)
        except OSError as err:
            raise UsageError(f"cannot write {label}: {err.strerror or err}") from err
        return
    path = _through_link(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile

        with _signals_held():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            _PENDING.add(tmp)
    except OSError as err:
        raise UsageError(f"cannot write {label}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _new_mode(path))  # mkstemp makes it 0600: the file's own or the usual
        with _signals_held():
            os.replace(tmp, path)
            _PENDING.discard(tmp)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _PENDING.discard(tmp)
        if isinstance(err, OSError):
            raise UsageError(f"cannot write {label}: {err.strerror or err}") from err
        raise


def atomic_write_text(path: Path, text: str, option: str = "") -> None:
    """``atomic_write`` of UTF-8 text."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data), option)


def remove_pending() -> None:
    """Remove every temp file still in flight (after an error or a signal)."""
    for tmp in list(_PENDING):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _PENDING.discard(tmp)


__all__ = [
    "atomic_write",
    "atomic_write_text",
    "check_distinct",
    "check_folder",
    "check_target",
    "is_stdout",
    "remove_pending",
    "same_file",
]
