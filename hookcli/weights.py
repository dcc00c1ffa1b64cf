"""``--weights PATH``: read a checkpoint and apply it to the model, strictly.

A checkpoint is one of:

- a ``torch.save`` file of a state dict (read with ``weights_only=True``; a dict
  holding it under ``state_dict``, ``model`` or ``model_state_dict`` is accepted, and
  keys that all carry ``torch.compile``'s ``_orig_mod.`` or DDP's ``module.`` prefix,
  which the model's keys do not, are read without it);
- a ``.safetensors`` file;
- a sharded checkpoint: an ``*.index.json`` whose ``weight_map`` names the shard
  of every tensor (``.safetensors`` or ``torch.save`` shards beside it);
- a folder holding one of these under its usual Hugging Face name.

"Strictly" means every key of the model's state dict is in the checkpoint with
the same shape, and the checkpoint has no other key. A key left out because it
is tied to one that is there (``lm_head.weight`` sharing ``embed_tokens.weight``,
which safetensors stores once) is not missing.

Such a dict may also hold the model's config (``model_args``, ``dims``, ``config``,
``hyper_parameters``): ``checkpoint_configs`` reads them for ``hookcli.kwargs`` to fill
the parameters ``-k`` leaves. ``sha256_of`` identifies the checkpoint in ``settings``.

On meta the tensors hold no values: the checkpoint's keys and shapes are
checked just as strictly (safetensors headers are read, never the data), and
nothing is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import struct
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookcli.errors import LoadError, first_line

if TYPE_CHECKING:
    import torch
    from torch import nn

# The names transformers saves under, most specific first.
_FOLDER_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def resolve_checkpoint(path: Path) -> Path:
    """A folder -> the checkpoint file inside it; a file is returned as it is."""
    if path.is_dir():
        for name in _FOLDER_FILES:
            if (path / name).is_file():
                return path / name
        found = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.index.json"))
        if len(found) == 1:
            return found[0]
        if found:
            raise LoadError(
                f"--weights {path} is a folder with several checkpoints "
                f"({', '.join(f.name for f in found[:4])}): name the file"
            )
        raise _not_a_checkpoint(
            path,
            "it is a folder with no checkpoint in it (looked for "
            f"{', '.join(_FOLDER_FILES)}, *.safetensors, *.index.json): name the file",
        )
    if not path.exists():
        raise LoadError(f"weights file not found: {path}")
    if not path.is_file():  # a FIFO would block the read forever, a device never ends
        raise LoadError(
            f"--weights {path} is not a regular file (a pipe, device or socket); "
            "give a checkpoint file"
        )
    return path


def read_checkpoint(path: Path, *, trust_pickle: bool = False, meta: bool = False) -> dict:
    """Every tensor of the checkpoint at ``path`` by key (on meta: shapes and dtypes only)."""
    path = resolve_checkpoint(path)
    if path.name.endswith(".index.json"):
        return _read_sharded(path, trust_pickle=trust_pickle, meta=meta)
    if _is_safetensors(path):
        return _read_safetensors(path, meta=meta)
    return _read_torch(path, trust_pickle=trust_pickle, meta=meta)


def _is_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    try:
        with path.open("rb") as f:
            head = f.read(9)
    except OSError:
        return False
    # an 8-byte little-endian header length, then the JSON header
    return len(head) == 9 and head[8:9] == b"{" and path.suffix not in (".pt", ".pth", ".bin")


def _read_sharded(index: Path, *, trust_pickle: bool, meta: bool) -> dict:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise LoadError(
            f"cannot read weights index {index}: not a sharded-checkpoint index "
            f"(expected a JSON object with a 'weight_map'): {first_line(err)}"
        ) from err
    state: dict[str, Any] = {}
    for shard in shards:
        shard_path = index.parent / shard
        if not shard_path.is_file():
            raise LoadError(f"weights index {index} names shard {shard}, which is not there")
        part = read_checkpoint(shard_path, trust_pickle=trust_pickle, meta=meta)
        wanted = {k for k, v in weight_map.items() if v == shard}
        state.update({k: v for k, v in part.items() if k in wanted})
    absent = sorted(set(weight_map) - set(state))
    if absent:
        raise LoadError(
            f"weights index {index} maps {len(absent)} key(s) to shards that do not hold them: "
            + ", ".join(absent[:10])
        )
    return state


def _safetensors_header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100_000_000:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError, struct.error) as err:
        raise LoadError(f"cannot read weights {path}: not a safetensors file ({err})") from err
    header.pop("__metadata__", None)
    return header


def _read_safetensors(path: Path, *, meta: bool) -> dict:
    import torch

    if meta:
        out = {}
        for key, info in _safetensors_header(path).items():
            name = _SAFETENSORS_DTYPES.get(str(info.get("dtype")), "float32")
            dtype = getattr(torch, name, torch.float32)
            out[key] = torch.empty(info.get("shape", []), dtype=dtype, device="meta")
        return out
    try:
        from safetensors.torch import load_file
    except ImportError as err:
        raise LoadError(
            f"reading {path} needs safetensors: pip install 'hookcli[safetensors]'"
        ) from err
    _safetensors_header(path)  # a clear message for a file that is not safetensors at all
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:
        raise LoadError(f"cannot read weights {path}: {first_line(err)}") from err


_ZIP_MAGIC = b"PK\x03\x04"
# torch.save's legacy (non-zip) format starts with its pickled magic number 0x1950a86a20f9469cfc6c
_LEGACY_MAGIC = b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def _not_a_checkpoint(path: Path, reason: str) -> LoadError:
    return LoadError(f"cannot read weights {path}: not a PyTorch checkpoint: {reason}")


def _sniff(path: Path) -> str:
    """What the file is by its first bytes: 'zip', 'torch-legacy', 'pickle'; else LoadError."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as err:
        raise LoadError(f"cannot read weights {path}: {err.strerror or err}") from err
    if not head:
        raise _not_a_checkpoint(path, "the file is empty (0 bytes)")
    if head.startswith(_ZIP_MAGIC):
        return "zip"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "torch-legacy" if head[2:14] == _LEGACY_MAGIC else "pickle"
    text = head.decode("utf-8", errors="replace")
    if "\ufffd" not in text[:-4] and all(c.isprintable() or c in "\t\r\n" for c in text[:-4]):
        first = " ".join(text.split())[:40]
        raise _not_a_checkpoint(path, f"it is a text file (it starts with {first!r})")
    shown = " ".join(f"{b:02x}" for b in head[:8])
    raise _not_a_checkpoint(
        path,
        f"its first bytes ({shown}) are no format hookcli reads: a torch.save file (zip or "
        "pickle), safetensors, or a sharded *.index.json",
    )


def _read_torch(path: Path, *, trust_pickle: bool, meta: bool) -> dict:
    import torch

    kind = _sniff(path)
    if kind == "pickle":
        state = _state_dict_in(path, _read_plain_pickle(path, trust_pickle=trust_pickle))
        where = "meta" if meta else "cpu"
        return {k: v.to(where) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    where = "meta" if meta else "cpu"
    try:
        obj = torch.load(path, map_location=where, weights_only=True)
    except pickle.UnpicklingError as err:
        if "unsupported global" not in str(err).lower():  # not a pickled object: unreadable
            raise _not_a_checkpoint(path, f"torch.load cannot read it ({first_line(err)})") from err
        if not trust_pickle:
            raise LoadError(
                f"{path} is not a plain state dict (it holds pickled objects); "
                "pass --trust-pickle to unpickle it if you trust the file"
            ) from err
        try:
            obj = torch.load(path, map_location=where, weights_only=False)
        except Exception as err2:
            raise LoadError(f"cannot read weights {path}: {first_line(err2)}") from err2
    except Exception as err:
        what = "a zip archive" if kind == "zip" else "a torch.save file"
        raise _not_a_checkpoint(path, f"{what} torch.load cannot read ({first_line(err)})") from err
    return dict(_state_dict_in(path, obj))


def _state_dict_in(path: Path, obj: Any) -> Mapping[str, Any]:
    """The state dict a checkpoint holds (``_extract_state_dict``), else exit 3."""
    state = _extract_state_dict(obj)
    if state is None:
        raise LoadError(
            f"{path} holds a {type(obj).__name__}, not a state dict "
            "(expected a dict of tensors, or one under 'state_dict', 'model' or "
            "'model_state_dict')"
        )
    return state


def checkpoint_configs(path: Path, *, trust_pickle: bool = False) -> list[tuple[str, dict]]:
    """The configs a ``torch.save`` checkpoint holds beside its weights, by key
    (``hookcli.kwargs.CHECKPOINT_CONFIG_KEYS`` order). Read lazily (``mmap``), without
    the tensors' data; a file that cannot be read gives none here (``apply_weights``
    says why, after the build)."""
    import torch

    from hookcli.kwargs import CHECKPOINT_CONFIG_KEYS, as_mapping

    try:
        path = resolve_checkpoint(path)
        if path.name.endswith(".index.json") or _is_safetensors(path):
            return []
        kind = _sniff(path)
    except LoadError:
        return []
    if kind == "pickle":
        return []
    mmap = kind == "zip"
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        if not trust_pickle:
            return []
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception:
            return []
    except Exception:
        return []
    if not isinstance(obj, Mapping):
        return []
    out = []
    for key in CHECKPOINT_CONFIG_KEYS:
        data = as_mapping(obj.get(key)) if key in obj else None
        if data is not None:
            out.append((key, data))
    return out


def sha256_of(path: Path) -> str:
    """The sha256 of the checkpoint's bytes: the file (a folder's checkpoint file), or for a
    sharded checkpoint its index followed by every shard in name order."""
    path = resolve_checkpoint(path)
    files = [path]
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
            files += [path.parent / s for s in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    digest = hashlib.sha256()
    for file in files:
        try:
            with file.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
        except OSError as err:
            raise LoadError(f"cannot read weights {file}: {err.strerror or err}") from err
    return digest.hexdigest()


_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def _without_wrapper_prefix(model: nn.Module, state: dict[str, Any], path: Path) -> dict[str, Any]:
    """Keys saved from a ``torch.compile``'d (``_orig_mod.``) or DDP (``module.``) model,
    every one with the prefix the model's own keys lack: read without it (a note says so)."""
    expected = list(model.state_dict().keys())
    changed = True
    while changed and state:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state) and not any(
                k.startswith(prefix) for k in expected
            ):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                print(
                    f"hookcli: note: --weights {path}: every key starts with {prefix!r} (a "
                    "model saved through its wrapper); read without it",
                    file=sys.stderr,
                    flush=True,
                )
                changed = True
    return state


def _read_plain_pickle(path: Path, *, trust_pickle: bool) -> Any:
    """A file written with ``pickle.dump`` (not torch.save): only with --trust-pickle."""
    if not trust_pickle:
        raise LoadError(
            f"{path} is a plain pickle file (pickle.dump, not torch.save): unpickling it can "
            "run any code; pass --trust-pickle to load it if you trust the file"
        )
    try:
        with path.open("rb") as f, _cpu_storages():
            return pickle.load(f)
    except Exception as err:
        raise _not_a_checkpoint(path, f"unpickling failed ({first_line(err)})") from err


@contextlib.contextmanager
def _cpu_storages() -> Iterator[None]:
    """Storages pickled outside torch.save come back through ``torch.load``: map them to
    the CPU, so a state dict pickled on a GPU loads on a machine without one."""
    import io

    import torch
    import torch.storage

    original = torch.storage._load_from_bytes

    def load_on_cpu(b: bytes) -> Any:
        return torch.load(io.BytesIO(b), map_location="cpu", weights_only=False)

    torch.storage._load_from_bytes = load_on_cpu
    try:
        yield
    finally:
        torch.storage._load_from_bytes = original


def _extract_state_dict(obj: Any) -> Mapping[str, Any] | None:
    import torch
    from torch import nn

    if isinstance(obj, nn.Module):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "model_state_dict"):
            inner = obj.get(key)
            if isinstance(inner, nn.Module):
                return inner.state_dict()
            if isinstance(inner, Mapping):
                return inner
        if all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
    return None


def check_fit(model: nn.Module, state: Mapping[str, torch.Tensor], path: Path) -> None:
    """Raise LoadError naming every missing, unexpected or wrongly shaped key."""
    expected = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for key, tensor in expected.items():
        groups.setdefault(id(tensor), []).append(key)
    missing = [
        k
        for k, t in expected.items()
        if k not in state and not any(other in state for other in groups[id(t)])
    ]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {list(state[k].shape)} (model {list(expected[k].shape)})"
        for k in state
        if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): " + ", ".join(missing[:20]))
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): " + ", ".join(unexpected[:20]))
    if shapes:
        problems.append(f"shape mismatches ({len(shapes)}): " + ", ".join(shapes[:10]))
    if problems:
        raise LoadError(f"weights {path} do not match the model; " + "; ".join(problems))


def apply_weights(model: nn.Module, path: Path, *, trust_pickle: bool = False) -> None:
    """Read the checkpoint at ``path`` and load it into ``model``, strictly.

    A model on meta is only checked (keys and shapes): meta tensors hold no values.
    """
    meta = any(t.is_meta for t in model.state_dict().values())
    state = _without_wrapper_prefix(
        model, read_checkpoint(path, trust_pickle=trust_pickle, meta=meta), path
    )
    check_fit(model, state, path)
    if meta:
        print(
            f"hookcli: note: --weights {path} matches the model (keys and shapes); "
            "on meta no values are loaded",
            file=sys.stderr,
            flush=True,
        )
        return
    from hookcli.preserve import before_values_change

    before_values_change(model)  # a MODEL instance gets its own values back after the run
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        msg = " ".join(str(err).split())
        raise LoadError(f"weights {path} do not fit the model: {msg[:400]}") from err
