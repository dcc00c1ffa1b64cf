"""Running a command on every rank of a torchrun or Slurm launch (``--ddp``).

    detect_env  RANK/WORLD_SIZE/LOCAL_RANK (torchrun), else SLURM_PROCID/SLURM_NTASKS/
                SLURM_LOCALID (srun) -> DistEnv
    launch      init_process_group(timeout) -> body(ctx) on every rank -> destroy
    DistContext the rank's view: ``step``/``sync`` agree that every rank got through a
                stage, ``gather`` brings per-rank findings to rank 0, ``compare`` checks
                tensors against rank 0's

Failures: a rank whose stage raised a HookcliError tells the others at the next
``sync`` (an ``all_gather_object`` of every rank's status), so every rank stops
there; rank 0 alone prints one line naming the rank, and every rank exits with
that rank's exit status. A rank that dies outright breaks the next collective
on the others (gloo closes the connection, or the group's timeout expires); they
then read the dead rank's message from the rendezvous store, where each rank
leaves one before it exits on an error.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from hookcli.errors import EXIT_INTERNAL, EXIT_RUN, HookcliError, RunError, UsageError, first_line

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hookcli.distributed.ranks import Divergence

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_SLURM_PORT = 29500
EXIT_TERMINATED = 143
_STORE_PREFIX = "hookcli/error/"
_RELEASED_PREFIX = "hookcli/released/"  # a rank has destroyed its process group
_RELEASE_WAIT_S = 60.0  # how long a rank waits for the others to release theirs


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the launch."""

    rank: int
    world_size: int
    local_rank: int
    source: str  # "torchrun" or "slurm"
    master_addr: str
    master_port: int


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[03-05,9],gpu1`` -> ``node03``."""
    depth = 0
    first = nodelist
    for i, ch in enumerate(nodelist):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            first = nodelist[:i]
            break
    first = first.strip()
    if "[" not in first:
        return first
    prefix, _, rest = first.partition("[")
    item = rest.rstrip("]").split(",")[0]
    return prefix + item.split("-")[0]


def _int(environ: Mapping[str, str], key: str) -> int:
    try:
        return int(environ[key])
    except ValueError:
        raise UsageError(
            f"environment variable {key}={environ[key]!r} is not a whole number"
        ) from None


def detect_env(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """torchrun's variables, else Slurm's (srun), else None (a plain process).

    Under Slurm, MASTER_ADDR defaults to the first host of SLURM_JOB_NODELIST and
    MASTER_PORT to 29500 + SLURM_JOB_ID % 1000 (jobs sharing a node get different ports).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            source="torchrun",
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        if "MASTER_PORT" in env:
            port = _int(env, "MASTER_PORT")
        else:
            job = _int(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else 0
            port = DEFAULT_SLURM_PORT + job % 1000
        return DistEnv(
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            source="slurm",
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=port,
        )
    return None


def rank_device(device: str, env: DistEnv) -> str:
    """``cuda`` (no index) becomes this rank's GPU, ``cuda:LOCAL_RANK``."""
    return f"cuda:{env.local_rank}" if device.strip().lower() == "cuda" else device


def default_backend(device: str) -> str:
    """nccl for CUDA, gloo otherwise."""
    return "nccl" if device.strip().lower().startswith("cuda") else "gloo"


class RankFailed(Exception):
    """Some rank failed: every rank raises this at the same point (internal)."""

    def __init__(self, rank: int | None, code: int, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        self.code = code
        self.message = message
        self.lost = lost  # found by a broken collective: the group is unusable

    @property
    def line(self) -> str:
        """The one line rank 0 prints."""
        return self.message if self.rank is None else f"rank {self.rank} failed: {self.message}"


@dataclass(frozen=True)
class _Status:
    rank: int
    code: int  # 0: fine
    message: str = ""


class DistContext:
    """One rank's handle on the process group (see the module docstring)."""

    def __init__(self, env: DistEnv, backend: str, device: str, timeout_s: float) -> None:
        self.env = env
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    # -- agreement ---------------------------------------------------------------------
    def _collective(self, stage: str, fn: Callable[[], T]) -> T:
        """Run a collective; a broken group (a peer died) becomes RankFailed."""
        try:
            return fn()
        except RankFailed:
            raise
        except Exception as err:  # gloo/nccl: peer closed the connection, or a timeout
            found = self._stored_failure()
            if found is not None:
                raise found from err
            msg = f"lost contact with the other ranks during {stage}: {first_line(err)}"
            raise RankFailed(None, EXIT_RUN, msg, lost=True) from err

    def sync(self, stage: str, error: BaseException | None = None) -> None:
        """Every rank reports how ``stage`` went; if any failed, every rank raises RankFailed."""
        import torch.distributed as dist

        status = _Status(self.rank, 0) if error is None else _status_of(self.rank, error)
        if error is not None:
            self.leave_message(status.code, status.message)
        statuses: list[Any] = [None] * self.world_size
        self._collective(stage, lambda: dist.all_gather_object(statuses, status))
        failed = [s for s in statuses if isinstance(s, _Status) and s.code]
        if failed:
            first = failed[0]
            raise RankFailed(first.rank, first.code, first.message)
        if self.is_main and sys.stderr.isatty():
            print(f"hookcli: {self.world_size} ranks done: {stage}", file=sys.stderr, flush=True)

    def step(self, stage: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` on this rank, then ``sync``: its value once every rank got through."""
        try:
            value = fn()
        except Exception as err:  # HookcliError, or a bug: the others must not wait for us
            self.sync(stage, err)
            raise AssertionError("unreachable: sync raises after a failure") from err
        self.sync(stage)
        return value

    def gather(self, obj: Any, stage: str = "gathering the findings") -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order; None on the other ranks."""
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        self._collective(stage, lambda: dist.gather_object(obj, out, dst=0))
        return out

    def share(self, value: T, stage: str = "finishing") -> T:
        """Rank 0's ``value`` on every rank (also a final barrier)."""
        import torch.distributed as dist

        box = [value]
        self._collective(stage, lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    # -- messages that survive a broken group ----------------------------------------------
    def leave_message(self, code: int, message: str) -> None:
        """Leave this rank's failure in the rendezvous store, for peers that lose contact."""
        store = _store()
        if store is None:
            return
        try:
            store.set(f"{_STORE_PREFIX}{self.rank}", f"{code}\t{message}")
        except Exception:  # the store lives on rank 0 or the agent: it may be gone too
            return

    def _stored_failure(self, wait_s: float = 3.0) -> RankFailed | None:
        """The first failure another rank left in the store (waits a little for it)."""
        store = _store()
        if store is None:
            return None
        keys = [f"{_STORE_PREFIX}{r}" for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + wait_s
        while True:
            try:
                for key in keys:
                    if store.check([key]):
                        code, _, message = store.get(key).decode().partition("\t")
                        rank = int(key.rsplit("/", 1)[1])
                        return RankFailed(rank, int(code), message, lost=True)
            except Exception:
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    # -- comparing tensors across ranks --------------------------------------------------
    def compare(
        self, tensors: Sequence[tuple[str, torch.Tensor | None]], kind: str
    ) -> list[Divergence]:
        """Each tensor against rank 0's: those that differ on this rank (empty on rank 0).

        Tensors of one dtype travel in one flat broadcast from rank 0; each rank
        compares its own against them element by element. NaN equals NaN at the same
        place; a tensor missing (None) on one rank but not on rank 0 differs.
        """
        import torch
        import torch.distributed as dist

        from hookcli.distributed.ranks import Divergence

        stage = f"comparing {kind}s across ranks"
        present = torch.tensor(
            [t is not None for _, t in tensors], dtype=torch.uint8, device=self.device
        )
        base_present = present.clone()
        self._collective(stage, lambda: dist.broadcast(base_present, src=0))
        groups: dict[torch.dtype, list[int]] = {}
        for i, (_, t) in enumerate(tensors):
            if t is not None and base_present[i]:
                groups.setdefault(_wire_dtype(t), []).append(i)
        out: list[Divergence] = []
        for i, (name, _) in enumerate(tensors):
            if bool(present[i]) != bool(base_present[i]):
                why = (
                    "no gradient, rank 0 has one" if base_present[i] else "a gradient, rank 0 none"
                )
                out.append(Divergence(kind, name, self.rank, math.inf, math.inf, why))
        for dtype, idx in groups.items():
            mine = torch.cat([_flat(tensors[i][1], dtype) for i in idx])
            base = mine if self.is_main else torch.empty_like(mine)
            self._collective(stage, functools.partial(dist.broadcast, base, src=0))
            if self.is_main:
                continue
            same = (mine == base) | (torch.isnan(mine) & torch.isnan(base))
            diff = torch.where(same, torch.zeros_like(mine), (mine - base).abs())
            diff = torch.nan_to_num(diff, nan=math.inf)  # NaN on one rank only
            sizes = [tensors[i][1].numel() for i in idx]  # type: ignore[union-attr]
            per_diff = [d.max() if d.numel() else d.new_zeros(()) for d in diff.split(sizes)]
            per_scale = [
                b.abs().nan_to_num(nan=0.0, posinf=0.0).max() if b.numel() else b.new_zeros(())
                for b in base.split(sizes)
            ]
            values = torch.stack([*per_diff, *per_scale]).double().tolist()
            n = len(idx)
            for k, i in enumerate(idx):
                diff, scale = values[k], values[n + k]
                if diff > 0:
                    rel = diff / scale if scale > 0 else math.inf
                    out.append(Divergence(kind, tensors[i][0], self.rank, diff, rel))
        return out


class _PeerFailed(Exception):
    """Another rank's forward failed: this one stops, and ``sync`` names that rank's error."""


class CallAgreement:
    """Before each call of ``modules`` the ranks agree that every one makes the same call.

    FSDP2 pairs the ranks' all-gathers by their order, one per unit call: when a
    rank-dependent branch makes one rank call a unit that another does not (or in
    another order), gloo aborts the process on the mismatched sizes, or the ranks wait
    for one another until the timeout. So a forward pre-hook, run before FSDP's own,
    all-gathers each rank's next call (an index into ``names``) and compares them;
    ``settle`` after the forward all-gathers its end (or its failure). Every rank sees
    the same values, so they all stop at the same call: on a mismatch every rank raises
    ``RankFailed`` naming what each rank called (``unit_desync_message``); when a rank
    ended its forward on an error, the others stop and ``settle`` leaves that error to
    the next ``sync``.
    """

    ENDED = -1
    FAILED = -2

    def __init__(self, ctx: DistContext, modules: Sequence[nn.Module], names: Sequence[str]):
        self.ctx = ctx
        self.names = tuple(names)
        self.history: list[str] = []  # the calls every rank made alike, in order
        self.failure: Exception | None = None  # raised inside the forward, once decided
        self._handles = [
            # prepend: before FSDP's pre-forward hook, which starts the unit's all-gather
            m.register_forward_pre_hook(functools.partial(self._before, i), prepend=True)
            for i, m in enumerate(modules)
        ]

    def _before(self, index: int, module: nn.Module, args: Any) -> None:
        self._agree(index)

    def _agree(self, code: int) -> None:
        import torch
        import torch.distributed as dist

        if self.failure is not None:  # decided already (the model caught our exception)
            raise self.failure
        mine = torch.tensor([code], dtype=torch.int64, device=self.ctx.device)
        every = [torch.empty_like(mine) for _ in range(self.ctx.world_size)]
        try:
            self.ctx._collective(
                "agreeing on the FSDP units each rank runs", lambda: dist.all_gather(every, mine)
            )
        except RankFailed as err:
            self.failure = err
            raise
        codes = torch.cat(every).tolist()
        if self.FAILED in codes:
            if code != self.FAILED:
                self.failure = _PeerFailed()
                raise self.failure
            return
        if len(set(codes)) == 1:
            if code >= 0:
                self.history.append(self.names[code])
            return
        from hookcli.distributed.ranks import unit_desync_message

        calls = [self.names[c] if c >= 0 else None for c in codes]
        self.failure = RankFailed(None, EXIT_RUN, unit_desync_message(self.history, calls))
        raise self.failure

    def settle(self, error: BaseException | None) -> bool:
        """After the forward (``error``: this rank's own failure): agree that it ended.

        Removes the hooks. Raises ``RankFailed`` when the ranks' calls differ (or a peer
        was lost); returns True when another rank's forward failed first, so this rank's
        own error (our exception, as the forward wrapped it) is not one to report.
        """
        self.close()
        if self.failure is None:
            with contextlib.suppress(_PeerFailed, RankFailed):  # kept in self.failure
                self._agree(self.ENDED if error is None else self.FAILED)
        if isinstance(self.failure, _PeerFailed):
            return True
        if self.failure is not None:
            raise self.failure
        return False

    def close(self) -> None:
        while self._handles:
            self._handles.pop().remove()


def _wire_dtype(t: torch.Tensor) -> torch.dtype:
    import torch

    if t.is_floating_point():
        return t.dtype
    return torch.float64  # integer/bool buffers: exact in float64 below 2**53


def _flat(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    assert t is not None
    return t.detach().reshape(-1).to(dtype)


def _status_of(rank: int, err: BaseException) -> _Status:
    if isinstance(err, HookcliError):
        return _Status(rank, err.exit_code, err.message)
    # not a HookcliError: hookcli's own code failed on this rank (exit 70, as in one process)
    return _Status(
        rank, EXIT_INTERNAL, f"internal error in hookcli (not the model's fault): {first_line(err)}"
    )


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def init_group(
    env: DistEnv, backend: str, device: str, timeout_s: float, flag: str = "--ddp"
) -> DistContext:
    """Start the default process group for this rank (exit 2 when it cannot)."""
    from datetime import timedelta

    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError(f"{flag} needs a PyTorch build with torch.distributed")
    if backend not in ("gloo", "nccl", "mpi", "ucc", "xccl"):
        raise UsageError(f"--backend {backend}: choose gloo (cpu) or nccl (cuda)")
    if backend == "nccl" and not device.startswith("cuda"):
        raise UsageError("--backend nccl needs --device cuda (gloo runs on cpu)")
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.setdefault("MASTER_PORT", str(env.master_port))
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    try:
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception as err:
        raise UsageError(
            f"could not start the {backend} process group (rank {env.rank} of "
            f"{env.world_size}, {env.master_addr}:{env.master_port}): {first_line(err)}"
        ) from err
    return DistContext(env, backend, device, timeout_s)


def launch(
    body: Callable[[DistContext], int],
    *,
    device: str,
    backend: str | None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    flag: str = "--ddp",
) -> int:
    """Run ``body`` on this rank inside a process group; the exit status, agreed by all ranks.

    ``body`` returns its exit status on every rank (rank 0 alone writes the report).
    When any rank fails, rank 0 prints one line naming it, and every rank returns
    that rank's exit status.
    """

    env = detect_env(environ)
    if env is None:
        raise UsageError(
            f"{flag} needs a distributed launch: run it under torchrun (torchrun "
            "--nproc_per_node=N -m hookcli ...) or srun (RANK/WORLD_SIZE or "
            "SLURM_PROCID/SLURM_NTASKS are not set)"
        )
    if timeout_s <= 0:
        raise UsageError(f"--dist-timeout must be positive, got {timeout_s:g}")
    device = rank_device(device, env)
    ctx = init_group(env, backend or default_backend(device), device, timeout_s, flag)
    previous = _on_sigterm()
    together = False  # every rank reached the end: they release the group together
    try:
        try:
            code = body(ctx)
        except RankFailed:
            raise
        except Exception as err:  # outside any step (rank 0 writing the report)
            status = _status_of(ctx.rank, err)
            if not ctx.is_main:
                ctx.leave_message(status.code, status.message)
                raise
            # The others wait for the exit status in the final share; speak first, as
            # torchrun stops this rank once they have exited.
            print(f"hookcli: error: {status.message}", file=sys.stderr, flush=True)
            with contextlib.suppress(RankFailed):
                ctx.share(status.code)
            return status.code
        code = ctx.share(code)
        together = True
        return code
    except RankFailed as failed:
        if ctx.is_main:
            print(f"hookcli: error: {failed.line}", file=sys.stderr, flush=True)
        if not failed.lost:
            # Every rank is still there: wait for rank 0's line before leaving, since
            # torchrun stops the other ranks as soon as one exits.
            with contextlib.suppress(RankFailed):
                ctx.share(failed.code, "reporting the failure")
        return failed.code
    finally:
        signal.signal(signal.SIGTERM, previous)
        _release(ctx, together)


def _release(ctx: DistContext, together: bool) -> None:
    """Destroy the process group; after a run every rank finished, wait for the others to
    have destroyed theirs before leaving.

    A rank's ``destroy_process_group`` can need its peers still there: on torch 2.6 with
    FSDP2's device mesh, the last rank to destroy hung for good once the others had
    exited. The rendezvous store, which outlives the group, carries one key per rank.
    """
    import torch.distributed as dist

    store = _store() if together else None  # taken first: it goes with the group
    with contextlib.suppress(Exception):  # already broken: nothing left to release
        dist.destroy_process_group()
    if store is None:
        return
    with contextlib.suppress(Exception):  # the store may be gone with a finished peer
        store.set(f"{_RELEASED_PREFIX}{ctx.rank}", "1")
        keys = [f"{_RELEASED_PREFIX}{r}" for r in range(ctx.world_size)]
        store.wait(keys, timedelta(seconds=_RELEASE_WAIT_S))


def _on_sigterm() -> Any:
    """SIGTERM (torchrun ending the ranks after one exited) -> RankFailed, exit 143."""

    def handler(signum: int, frame: Any) -> None:
        raise RankFailed(
            None,
            EXIT_TERMINATED,
            "this rank was stopped by SIGTERM: the launcher ends every rank once one exits "
            "(its summary names the rank that failed first)",
        )

    return signal.signal(signal.SIGTERM, handler)


# -- pieces the --ddp commands share -------------------------------------------------------


def redraw_inputs(args: Sequence[Any], kwargs: Mapping[str, Any], seed: int) -> tuple[Any, Any]:
    """Every tensor redrawn like itself from a Generator seeded with ``seed``, in order.

    Floating tensors with ``torch.randn``, integer ones with ``torch.randint`` over the
    example's own [min, max] (as ``--batch-size`` redraws ``example_input_array``).
    """
    import torch

    g = torch.Generator().manual_seed(seed)

    def redraw(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                new = torch.randn(value.shape, generator=g, dtype=value.dtype)
            elif value.numel() and value.dtype != torch.bool:
                low, high = int(value.min()), int(value.max()) + 1
                new = torch.randint(low, high, value.shape, generator=g).to(value.dtype)
            elif value.numel():
                new = torch.randint(0, 2, value.shape, generator=g).to(value.dtype)
            else:
                new = value.clone()
            return new.to(value.device)
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(redraw(v) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(redraw(v) for v in value)
        if isinstance(value, dict):
            return {k: redraw(v) for k, v in value.items()}
        return value

    new_args = tuple(redraw(a) for a in args)
    new_kwargs = {k: redraw(v) for k, v in kwargs.items()}
    return new_args, new_kwargs


def wrap_ddp(model: nn.Module, ctx: DistContext, broadcast_buffers: bool = True) -> nn.Module:
    """``DistributedDataParallel(model)``; find_unused_parameters so a rank may skip some."""
    from torch.nn.parallel import DistributedDataParallel

    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("--ddp needs a model with trainable parameters (DDP refuses others)")
    device_ids = [ctx.device] if ctx.device.startswith("cuda") else None
    try:
        # find_unused_parameters: DDP then marks what a rank did not use as ready at the
        # end of forward instead of waiting for it (which would hang or fail the next
        # step); the tensor hooks still see which parameters got no grad on each rank.
        if broadcast_buffers:  # DDP's default: rank 0's buffers at every forward
            return DistributedDataParallel(
                model, device_ids=device_ids, find_unused_parameters=True
            )
        with warnings.catch_warnings():
            # newer torch calls the flag deprecated (forward_sync_buffers), but only
            # broadcast_buffers=False also skips the sync at wrapping, as a user's job does
            warnings.simplefilter("ignore", FutureWarning)
            return DistributedDataParallel(
                model, device_ids=device_ids, find_unused_parameters=True, broadcast_buffers=False
            )
    except Exception as err:
        msg = f"DistributedDataParallel could not wrap the model: {first_line(err)}"
        raise RunError(msg) from err
