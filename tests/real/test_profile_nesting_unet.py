"""diffusers' UNet2DConditionModel under ``profile --backward``: keyword-called down
blocks returning ``(h, (skip, skip))``, skip connections into the up blocks, a
dataclass output. Its backward spans overlap and outlast their parents' own hooks
(the root's self time read -210 ms before); the times must nest, per call and per row,
forward and backward, and the html icicle's bars too."""

from __future__ import annotations

import torch

from tests.real.conftest import need
from tests.test_profile_nesting import assert_calls_nest, assert_icicle_nests, assert_rows_nest


def _unet() -> tuple[torch.nn.Module, torch.Tensor, dict[str, torch.Tensor]]:
    diffusers = need("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )
    kwargs = {"timestep": torch.tensor([1]), "encoder_hidden_states": torch.randn(1, 4, 32)}
    return model, torch.randn(1, 4, 16, 16), kwargs


def test_unet_profile_times_nest() -> None:
    from hookcli.api import live
    from hookcli.options import Mode
    from hookcli.profile.runner import build_report, collect, plan_profile

    model, x, kwargs = _unet()
    plan = plan_profile(backward=True, warmup=1, repeat=2)
    prepared = live(model, (x,), kwargs, Mode("eval"), None)
    m, error = collect(prepared, plan)
    assert error is None and m is not None and m.timings is not None
    assert m.timings.bwd_incl is not None
    assert m.timings.bwd_incl[0][0] is not None  # the root has a backward time
    assert_calls_nest(m)
    report = build_report(prepared, plan, m, None)  # the rows of the same passes
    assert assert_rows_nest(report, ("forward", "backward")) > 100
    for phase in ("forward", "backward"):
        assert_icicle_nests(report, phase)
