"""Store objects are named by a fingerprint of every weight byte (issue 34): two fine-tunes of
one base that differ only in a middle tensor never share a store object; a byte-identical copy
of a checkpoint does."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hycache.engine.engine import LLM
from hycache.engine.tier import weights_identity
from hycache.model.loader import save_model
from tests.helpers import GEOMETRY, SP, family

MIDDLE = "model.layers.2.self_attn.o_proj.weight"
EDGE = 1 << 16  # what the old fingerprint read at each end of a file


def data_range(file: Path, name: str) -> tuple[int, int]:
    """Where tensor `name`'s bytes lie in a safetensors file."""
    raw = file.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    start, end = header[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def fine_tunes(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(base, a copy of base, base with one middle attention projection times -4)."""
    base = tmp_path / "base"
    save_model(LLM("tiny", **GEOMETRY).model, base)
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    tuned = tmp_path / "tuned"
    shutil.copytree(base, tuned)
    (file,) = sorted(tuned.glob("*.safetensors"))
    tensors = load_file(str(file))
    tensors[MIDDLE] = tensors[MIDDLE] * -4
    save_file(tensors, str(file), metadata={"format": "pt"})
    start, end = data_range(file, MIDDLE)
    size = file.stat().st_size
    assert start > EDGE and end < size - EDGE  # the change lies away from both edges
    assert size == (base / file.name).stat().st_size
    return base, copy, tuned


def test_fine_tunes_differing_mid_file_never_share_store_objects(tmp_path: Path) -> None:
    from hycache.store import HostStore

    base, copy, tuned = fine_tunes(tmp_path)
    assert weights_identity(str(base)) == weights_identity(str(copy))
    assert weights_identity(str(base)) != weights_identity(str(tuned))
    fam = family()
    shared = HostStore(1 << 28)
    first = LLM(str(base), kv_store=shared, **GEOMETRY)
    first.generate([fam[0]], SP)
    first.generate([fam[1]], SP)
    same = LLM(str(copy), kv_store=shared, **GEOMETRY).generate([fam[2]], SP)[0]
    assert same.store_hit_tokens > 0  # control: identical bytes share the store
    other = LLM(str(tuned), kv_store=shared, **GEOMETRY)
    out = other.generate([fam[2]], SP)[0]
    assert out.store_hit_tokens == 0 and out.hit_tokens == 0
    want = LLM(str(tuned), enable_prefix_caching=False, **GEOMETRY).generate([fam[2]], SP)[0]
    assert out.token_ids == want.token_ids
    assert not torch.equal(first.model.state_dict()[MIDDLE], other.model.state_dict()[MIDDLE])
