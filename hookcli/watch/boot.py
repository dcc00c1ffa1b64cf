"""Called by the bootstrap's ``sitecustomize`` once torch is imported in a watched process.

Installs the process-wide monitor (``hookcli.watch.monitor``) with the options from
``HOOKCLI_WATCH_CONFIG``, writing to a steps file under its folder. Until a process
steps an optimizer (or completes a backward), that is two global optimizer hooks and a
wrapper around ``torch.autograd.backward``: nothing runs per module call.
"""

from __future__ import annotations

_armed = False


def arm() -> None:
    """Install the monitor in this process, once."""
    global _armed
    if _armed:
        return
    _armed = True
    from hookcli.watch.config import WatchConfig
    from hookcli.watch.monitor import FileSink, Monitor

    config = WatchConfig.from_env()
    Monitor(config, FileSink(config)).install(process=True)
    if config.out:  # tell hookcli watch that this process is watched (docs/watch.md)
        _mark(config.out)


def _mark(folder: str) -> None:
    import contextlib
    import os

    from hookcli.watch.config import ARMED

    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(folder, ARMED), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        finally:
            os.close(fd)
