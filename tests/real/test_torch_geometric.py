"""torch-geometric: ``torch_geometric.nn.models.GCN`` on a random graph, node features and
an ``edge_index`` of int64 node ids, as PyG's examples call it."""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.real.conftest import need
from tests.real.oracle import Package, PackageChecks

CONFIG: dict[str, Any] = {
    "in_channels": 8,
    "hidden_channels": 16,
    "num_layers": 2,
    "out_channels": 4,
}


def gcn() -> nn.Module:
    return need("torch_geometric.nn.models").GCN(**CONFIG)


class TestGeometricGCN(PackageChecks):
    package = Package(
        module="torch_geometric",
        spec="torch_geometric.nn.models:GCN",
        build=gcn,
        kwargs=CONFIG,
        inputs=("20x8", "int64:2x60:0..20"),
    )
