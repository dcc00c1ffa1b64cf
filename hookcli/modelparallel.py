"""``--model-parallel N``: the process group and model-parallel groups that fairscale's
and Megatron's parallel layers (``ColumnParallelLinear``, ``RowParallelLinear``,
``ParallelEmbedding``) ask for while they are built and run.

In a plain process: a gloo group of one (an in-memory store, no port), then
``fairscale.nn.model_parallel.initialize.initialize_model_parallel(N)`` and, where
``megatron.core`` is importable, ``parallel_state.initialize_model_parallel(N)``.
Under torchrun (``RANK``/``WORLD_SIZE`` set): the launch's group (started here, gloo,
``env://``, unless ``--ddp``/``--fsdp`` started it), N ranks to a model-parallel group.
Part of the shared core (loading calls it), so it imports no capability. Whatever is
set up here is torn down when the command ends, and only that.

Without the option, a build that stops on "model parallel group is not initialized"
is refused with one line naming the option (``refusal``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from collections.abc import Callable

from hookcli.errors import LoadError, UsageError, first_line

# fairscale: "model parallel group is not initialized"; Megatron: "tensor model parallel
# group is not initialized" (older: "intra_layer_model parallel group ...")
_MESSAGE = "model parallel group is not initialized"


def refusal(spec: str, err: BaseException) -> LoadError | None:
    """The one-line refusal of a build that wanted a model-parallel group; else None."""
    found: BaseException | None = None
    seen: BaseException | None = err
    while seen is not None:  # the innermost: the layer's own assertion
        if _MESSAGE in str(seen):
            found = seen
        seen = seen.__cause__
    if found is None:
        return None
    return LoadError(
        f"could not build {spec}: {str(found).strip().splitlines()[0]} (fairscale/Megatron "
        "model-parallel layers want a process group): add --model-parallel 1"
    )


def set_up(size: int) -> Callable[[], None]:
    """The groups for a model-parallel size of ``size``; the function that tears down
    what this call created (exit 2 when the launch cannot give that size)."""
    import os

    import torch.distributed as dist

    if size < 1:
        raise UsageError(f"--model-parallel must be >= 1, got {size}")
    if not dist.is_available():
        raise UsageError("--model-parallel needs a PyTorch build with torch.distributed")
    undo: list[Callable[[], None]] = []
    try:
        if not dist.is_initialized():
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun's
                dist.init_process_group("gloo", init_method="env://")
            else:
                store = dist.HashStore()  # one process: no port, no network
                dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            undo.append(_destroy_group)
        world = dist.get_world_size()
        if size > world or world % size:
            launch = (
                f"run it under torchrun --nproc_per_node={size}"
                if world == 1
                else f"the launch has {world} processes; give a size that divides it"
            )
            raise UsageError(f"--model-parallel {size}: {launch}")
        undo.extend(_fairscale(size))
        undo.extend(_megatron(size))
    except UsageError:
        _run(undo)
        raise
    except Exception as err:
        _run(undo)
        raise UsageError(
            f"--model-parallel {size}: could not set up the groups: {first_line(err)}"
        ) from err
    return lambda: _run(undo)


def _run(undo: list[Callable[[], None]]) -> None:
    """Each step undone, the last made first; one that fails does not stop the others."""
    while undo:
        with contextlib.suppress(Exception):
            undo.pop()()


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _fairscale(size: int) -> list[Callable[[], None]]:
    """fairscale's groups (its "> initializing ..." lines are hookcli's call, not the
    model's: not shown)."""
    if importlib.util.find_spec("fairscale") is None:
        return []
    from fairscale.nn.model_parallel import initialize as fs_init

    if fs_init.model_parallel_is_initialized():
        return []  # the user's own (an in-process caller): theirs to keep
    with contextlib.redirect_stdout(io.StringIO()):
        fs_init.initialize_model_parallel(size)
    return [fs_init.destroy_model_parallel]


def _megatron(size: int) -> list[Callable[[], None]]:
    """megatron.core's tensor-parallel groups, where that package is installed."""
    try:
        if importlib.util.find_spec("megatron.core") is None:
            return []
    except (ImportError, ValueError):
        return []
    try:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            return []
        with contextlib.redirect_stdout(io.StringIO()):
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=size)
    except Exception as err:  # installed but not usable here (it may want CUDA): fairscale's
        # groups still serve; a Megatron model then stops with its own message
        print(
            f"hookcli: note: megatron.core's model-parallel groups not set up: {first_line(err)}",
            file=sys.stderr,
            flush=True,
        )
        return []
    return [parallel_state.destroy_model_parallel]
