"""TorchScript and ``torch.compile``d models: what hooks can see of them.

- ``torch.jit.script`` / ``torch.jit.trace`` give a ``ScriptModule``: its forward
  runs as TorchScript, and PyTorch refuses Python hooks on it
  (``register_forward_hook is not supported on ScriptModules``). A scripted root
  is refused with one line (``params`` still reads its parameters, no hooks
  needed); scripted submodules of an eager model run without hooks, and are
  named on stderr.
- ``torch.compile(model)`` gives an ``OptimizedModule`` that keeps the eager model
  as ``_orig_mod``: hookcli reports that one (its names without the
  ``_orig_mod.`` prefix, and no compilation while hooks are attached).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hookcli.errors import UsageError

if TYPE_CHECKING:
    from torch import nn


def is_scripted(module: nn.Module) -> bool:
    """A TorchScript module (``torch.jit.script`` or ``torch.jit.trace``)."""
    import torch

    return isinstance(module, torch.jit.ScriptModule)


def scripted_roots(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost TorchScript modules in ``model`` (their children are TorchScript too)."""
    out: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if is_scripted(m) and not any(name.startswith(f"{o}.") for o, _ in out if o):
            out.append((name, m))
    return out


def check_scripted(
    model: nn.Module, global_hooks: bool, backward: bool, only: set[int] | None = None
) -> set[int]:
    """The ids of the TorchScript modules a session must leave unhooked.

    A scripted root is exit 2 (nothing of it can be hooked); so are scripted
    submodules with global backward hooks, which torch calls on every module, and
    scripted modules among those ``only`` names (the modules to hook).
    """
    roots = scripted_roots(model)
    if not roots:
        return set()
    if roots[0][0] == "":
        raise UsageError(
            f"the model is a TorchScript module ({type(model).__name__}, from torch.jit.script "
            "or torch.jit.trace): PyTorch runs no Python hooks on it, so its layers cannot be "
            "seen; pass the eager nn.Module it was made from (hookcli inspect --no-forward "
            "shows a TorchScript module's tree and parameters, hookcli params its parameters)"
        )
    listed = ", ".join(n for n, _ in roots)
    if global_hooks and backward:
        raise UsageError(
            f"TorchScript submodule(s) {listed} take no backward hooks, and --global-hooks "
            "puts them on every module: run without --global-hooks"
        )
    unhooked = {id(m) for _, root in roots for m in root.modules()}
    if only is not None and only & unhooked:
        raise UsageError(
            f"cannot hook TorchScript module(s) inside {listed}: PyTorch runs no Python hooks "
            "on them; select eager modules"
        )
    what = "the modules within them are" if global_hooks else "they and the modules within are"
    print(
        f"hookcli: note: TorchScript submodule(s) {listed} run without hooks (PyTorch runs "
        f"no Python hooks in TorchScript): {what} not in the report",
        file=sys.stderr,
        flush=True,
    )
    return unhooked


def eager_module(module: nn.Module) -> tuple[nn.Module, str | None]:
    """The eager model under a ``torch.compile`` wrapper (``_orig_mod``), and a note."""
    inner = getattr(module, "_orig_mod", None)
    from torch import nn

    if type(module).__name__ != "OptimizedModule" or not isinstance(inner, nn.Module):
        return module, None
    note = (
        f"hookcli: note: the model is torch.compile'd: reporting the eager "
        f"{type(inner).__name__} underneath (_orig_mod), run without compilation"
    )
    return inner, note


def refuse_scripted(selected: list[tuple[str, nn.Module]], option: str = "--layer") -> None:
    """Exit 2 when ``option`` selected a TorchScript module: no Python hook can go on it."""
    names = [name or "(root)" for name, m in selected if is_scripted(m)]
    if names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise UsageError(
            f"{option} selects TorchScript module(s) {shown}: PyTorch runs no Python hooks "
            "on them; select eager modules"
        )
