"""``--model-parallel N``: Meta's reference Llama (fairscale's ColumnParallelLinear,
RowParallelLinear and ParallelEmbedding, ``init_method=lambda x: x``) from the command
line, checked against the same module built in Python after initialising fairscale
here: parameter counts by ``sum(p.numel())``, the loss and the total grad norm by plain
autograd in float64. Without the option the build is refused with one line naming it;
after a run, the groups hookcli made are gone.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fairscale.nn.model_parallel import initialize as fs_init

from hookcli.errors import LoadError
from hookcli.modelparallel import refusal
from tests.conftest import invoke
from tests.fixtures import llama_fairscale as llama

FILE = Path(llama.__file__)
SPEC = f"{FILE}:Transformer"
ARGS = dict(
    dim=32, n_layers=2, n_heads=4, vocab_size=64, multiple_of=16, max_seq_len=16, max_batch_size=2
)
KWARGS = [x for k, v in ARGS.items() for x in ("-k", f"params.{k}={v}")]


@pytest.fixture
def fairscale_groups() -> Iterator[None]:
    """A gloo group of one and fairscale's model-parallel group of 1, made here."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    fs_init.initialize_model_parallel(1)
    try:
        yield
    finally:
        fs_init.destroy_model_parallel()
        dist.destroy_process_group()


def _built() -> torch.nn.Module:
    """The module as Python builds it on the CPU: its KV cache's ``.cuda()`` a no-op here
    (the published code needs a GPU for that line alone)."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        torch.manual_seed(0)
        return llama.Transformer(llama.ModelArgs(**ARGS))
    finally:
        torch.Tensor.cuda = cuda  # type: ignore[method-assign]


def _no_groups_left() -> None:
    assert not dist.is_initialized()
    assert not fs_init.model_parallel_is_initialized()


def test_refused_without_the_option_with_one_line_naming_it() -> None:
    result = invoke("params", SPEC, *KWARGS)
    assert result.exit_code == 3, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "model parallel group is not initialized" in lines[0]
    assert "add --model-parallel 1" in lines[0]
    _no_groups_left()


def test_params_match_the_module_built_after_initialising_fairscale(fairscale_groups: None) -> None:
    model = _built()
    expected = sum(p.numel() for p in model.parameters())
    per_name = {n: p.numel() for n, p in model.named_parameters()}
    assert fs_init.get_model_parallel_world_size() == 1
    fs_init.destroy_model_parallel()
    dist.destroy_process_group()
    try:
        result = invoke(
            "params", SPEC, *KWARGS, "--model-parallel", "1", "--format", "json", "-d", "9"
        )
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["totals"]["params"] == expected
        assert report["settings"]["model_parallel"] == 1
        rows = {r["name"]: r["numel"] for r in report["params"]}
        assert rows == per_name
        _no_groups_left()  # torn down after the run
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        fs_init.initialize_model_parallel(1)


def test_grads_match_plain_autograd_in_float64(tmp_path: Path, fairscale_groups: None) -> None:
    # init_method=lambda x: x leaves the weights as torch.Tensor(...) made them (whatever
    # memory held): the reference code loads a checkpoint, and so does this test
    model = _built()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    ckpt = tmp_path / "consolidated.00.pth"
    torch.save(model.state_dict(), ckpt)
    model.double()
    torch.manual_seed(0)
    tokens, start_pos = llama.tokens()
    out = model(tokens, start_pos)
    loss = out.sum()
    loss.backward()
    grad_norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
    fs_init.destroy_model_parallel()
    dist.destroy_process_group()
    try:
        result = invoke(
            "grads",
            SPEC,
            *KWARGS,
            "--model-parallel",
            "1",
            "--weights",
            str(ckpt),
            "--inputs-from",
            f"{FILE}:tokens",
            "--format",
            "json",
        )
        assert result.exit_code == 0, result.output
        totals = json.loads(result.stdout)["totals"]
        # hookcli runs float32; the reference's rotary embedding is float32 in both
        assert math.isclose(float(totals["loss"]), float(loss.detach()), rel_tol=1e-5)
        assert math.isclose(float(totals["grad_norm"]), grad_norm, rel_tol=1e-5)
        _no_groups_left()
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        fs_init.initialize_model_parallel(1)


def test_megatrons_wording_is_refused_the_same_way() -> None:
    """megatron.core's ``get_tensor_model_parallel_group`` asserts "tensor model parallel
    group is not initialized" (its older ``mpu``: "intra_layer_model parallel group ...")."""
    for text in (
        "tensor model parallel group is not initialized",
        "intra_layer_model parallel group is not initialized",
    ):
        cause = AssertionError(text)
        err = LoadError(f"could not build gpt.py:GPTModel: {text}")
        err.__cause__ = cause
        refused = refusal("gpt.py:GPTModel", err)
        assert refused is not None
        assert refused.message.startswith(f"could not build gpt.py:GPTModel: {text} (")
        assert refused.message.endswith("add --model-parallel 1")
    assert refusal("gpt.py:GPTModel", RuntimeError("data parallel group is missing")) is None


def test_a_size_one_process_cannot_give_is_exit_2_naming_torchrun() -> None:
    result = invoke("params", SPEC, *KWARGS, "--model-parallel", "2")
    assert result.exit_code == 2, result.output
    assert "torchrun --nproc_per_node=2" in result.stderr
    _no_groups_left()


def test_the_users_own_groups_are_kept(fairscale_groups: None) -> None:
    """An in-process caller that set fairscale up itself keeps its groups after the run."""
    result = invoke("params", SPEC, *KWARGS, "--model-parallel", "1", "-d", "0")
    assert result.exit_code == 0, result.output
    assert dist.is_initialized()
    assert fs_init.model_parallel_is_initialized()


@pytest.mark.distributed
def test_torchrun_two_ranks_model_parallel_two(tmp_path: Path) -> None:
    """Two ranks, ``--model-parallel 2``: each rank's report counts the parameters of its
    own shard, as the module built under torchrun with fairscale's groups of 2 has them."""
    from tests.test_distributed import torchrun

    script = tmp_path / "shard_oracle.py"
    script.write_text(
        "import json, os, sys\n"
        "import torch, torch.distributed as dist\n"
        f"sys.path.insert(0, {str(FILE.parent.parent.parent)!r})\n"
        "from fairscale.nn.model_parallel import initialize as fs_init\n"
        "from tests.fixtures import llama_fairscale as llama\n"
        "torch.Tensor.cuda = lambda self, *a, **k: self\n"
        "dist.init_process_group('gloo')\n"
        "fs_init.initialize_model_parallel(2)\n"
        "torch.manual_seed(0)\n"
        f"m = llama.Transformer(llama.ModelArgs(**{ARGS!r}))\n"
        "n = sum(p.numel() for p in m.parameters())\n"
        "out = os.path.join(sys.argv[1], f'rank{dist.get_rank()}.json')\n"
        "open(out, 'w').write(json.dumps(n))\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    oracle = torchrun(tmp_path, str(script), str(tmp_path), module=False)
    assert oracle["returncode"] == 0, oracle
    expected = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert expected[0] < _whole_count()  # a shard, not the whole model
    run = torchrun(tmp_path, "params", SPEC, *KWARGS, "--model-parallel", "2", "--format", "json")
    assert run["returncode"] == 0, run
    for rank in (0, 1):
        report = json.loads(run["ranks"][rank]["stdout"])
        assert report["totals"]["params"] == expected[rank], (rank, run["ranks"][rank])
        assert report["settings"]["model_parallel"] == 2


def _whole_count() -> int:
    """The whole model's parameter count (a group of one), to tell a shard from it."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    fs_init.initialize_model_parallel(1)
    try:
        return sum(p.numel() for p in _built().parameters())
    finally:
        fs_init.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
