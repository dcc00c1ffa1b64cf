"""Models for ``--ddp`` runs under torchrun: healthy, a rank-dependent unused branch, BatchNorm.

Use them as ``sample_models.distributed:NAME``. Each has ``example_input_array``;
under ``--ddp`` rank r redraws it with ``seed + r``.
"""

import torch
from torch import nn


def current_rank() -> int:
    """This process's rank in the default group, 0 outside torch.distributed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class HealthyMLP(nn.Module):
    """Every parameter is used on every rank; no buffers: nothing to report under DDP."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(width, width)
        self.head = nn.Linear(width, 3)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.fc2(self.act(self.fc1(x)))))


class RankBranch(nn.Module):
    """Even ranks run ``branch_a``, odd ranks ``branch_b``: each rank leaves one unused.

    Plain DDP (find_unused_parameters=False) fails on the next step with "Expected to
    have finished reduction in the prior iteration", or hangs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.branch_a = nn.Linear(8, 4)
        self.branch_b = nn.Linear(8, 4)
        self.head = nn.Linear(4, 2)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        branch = self.branch_a if current_rank() % 2 == 0 else self.branch_b
        return self.head(branch(h))


class BatchNormNet(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: running stats follow each rank's batch.

    DDP broadcasts rank 0's buffers before forward, then every rank updates them
    from its own batch, so they differ across ranks after the step (SyncBatchNorm
    would keep them equal).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.bn = nn.BatchNorm1d(6)
        self.act = nn.ReLU()
        self.head = nn.Linear(6, 2)
        self.example_input_array = torch.randn(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.bn(self.fc(x))))


class FailsOnRank(nn.Module):
    """Raises in ``block`` on rank ``rank`` only (the others would wait for it in DDP)."""

    def __init__(self, rank: int = 1) -> None:
        super().__init__()
        self.rank = rank
        self.fc = nn.Linear(8, 8)
        self.block = _Fragile(rank)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.fc(x))


class _Fragile(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if current_rank() == self.rank:
            raise ValueError(f"refusing to run on rank {self.rank}")
        return self.fc(x)


class NaNOnRank(nn.Module):
    """``scale`` multiplies by NaN on rank ``rank`` only: NaN grads there before the all-reduce."""

    def __init__(self, rank: int = 1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.scale = _RankScale(rank)
        self.fc2 = nn.Linear(8, 2)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.scale(self.fc1(x)))


class _RankScale(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (float("nan") if current_rank() == self.rank else 1.0)


class ParamDriftOnRank(nn.Module):
    """Nudges ``fc.weight`` in place on rank ``rank`` during forward: a real desync.

    A stand-in for a rank-local weight update (an optimizer stepped on one rank, a
    rank-dependent re-initialisation): DDP syncs parameters only when it wraps the
    model, so the weights stay different on that rank after the step.
    """

    def __init__(self, rank: int = 1) -> None:
        super().__init__()
        self.rank = rank
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.example_input_array = torch.randn(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if current_rank() == self.rank:
            with torch.no_grad():
                self.fc.weight.add_(0.01)
        return self.head(torch.relu(self.fc(x)))
