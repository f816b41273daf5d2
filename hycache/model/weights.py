"""Reading a checkpoint's weights: its safetensors files (sharded or not, through
`model.safetensors.index.json`), a JSON object file, and strict state-dict checking (every
missing, unexpected or misshaped tensor named), shared by the loader, the EAGLE head and the MTP
drafter. No model class: torch and safetensors only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

_LOADABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_state_dict(
    expected: Mapping[str, torch.Size],
    found: Mapping[str, torch.Size],
    *,
    what: str,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Raise ValueError naming every missing, unexpected or misshaped tensor."""
    missing = sorted(k for k in expected if k not in found and k not in optional)
    unexpected = sorted(k for k in found if k not in expected and k not in optional)
    misshaped = sorted(
        f"{k}: checkpoint {tuple(found[k])} vs model {tuple(expected[k])}"
        for k in expected
        if k in found and tuple(found[k]) != tuple(expected[k])
    )
    problems = []
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    if misshaped:
        problems.append(f"shape mismatch {misshaped}")
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))


def load_checked(
    module: torch.nn.Module,
    tensors: Mapping[str, torch.Tensor],
    *,
    what: str,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Copy `tensors` into `module`'s state dict (cast to each parameter's dtype and device)
    after `check_state_dict` has found every name and shape right."""
    expected = {k: v.shape for k, v in module.state_dict().items()}
    found = {k: t.shape for k, t in tensors.items()}
    check_state_dict(expected, found, what=what, optional=optional)
    with torch.no_grad():
        state = module.state_dict()
        for key, t in tensors.items():
            state[key].copy_(t.to(device=state[key].device, dtype=state[key].dtype))


def read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of the given files (CPU). Raises ValueError on a tensor present twice or
    stored in an unsupported dtype."""
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            fh_cm = safe_open(str(f), framework="pt", device="cpu")
            with fh_cm as fh:
                for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if key in tensors:
                        raise ValueError(f"tensor {key!r} appears in more than one file ({f.name})")
                    t = fh.get_tensor(key)
                    if t.dtype not in _LOADABLE_DTYPES:
                        raise ValueError(f"tensor {key!r} has unsupported dtype {t.dtype}")
                    tensors[key] = t
        except ValueError:
            raise
        except Exception as exc:  # safetensors' own error for a corrupt or truncated file
            raise ValueError(f"{f}: not a readable safetensors file ({exc})") from None
    return tensors


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; ValueError naming the file otherwise."""
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: its index's shards (each inside the
    directory), else every `*.safetensors` file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' dict")
        names = sorted(set(weight_map.values()))
        root = path.resolve()
        for name in names:
            # an index must not reach outside its checkpoint (`../../etc/x`, absolute paths)
            if not isinstance(name, str) or not (path / name).resolve().is_relative_to(root):
                raise ValueError(f"{index}: shard {name!r} lies outside the checkpoint directory")
        files = [path / name for name in names]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{f} (listed in {index.name}) does not exist")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return files


def check_index(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """ValueError when the index lists a tensor no shard holds."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return
    weight_map: dict[str, str] = read_json_object(index)["weight_map"]
    listed_missing = sorted(k for k in weight_map if k not in tensors)
    if listed_missing:
        raise ValueError(f"{index.name} lists tensors that no shard holds: {listed_missing}")


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint directory `path` (CPU), its index checked."""
    tensors = read_safetensors(checkpoint_files(path))
    check_index(path, tensors)
    return tensors
