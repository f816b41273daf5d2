"""Result and trace files: written whole or not at all, their paths checked before a long run.

The one home of `write_atomic`, `jsonl` and `check_writable` (the command line's results, the
benchmarks' documents and `hycache trace-gen`'s traces).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def check_writable(path: str | Path | None, flag: str) -> None:
    """Fail now, with `flag` in the message, when `path` could not be written later (checked
    before a long run, never after it): its folder is missing and cannot be made, is a file,
    or is read-only; or the path is a folder."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a folder; give a file path")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag}: cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot write {path}: {parent} is not writable")


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write the whole file (text, or bytes as they are) or nothing: a failure leaves no
    partial output behind. The file gets the usual permissions (0666 less the umask), not
    the temporary file's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if isinstance(text, bytes):
            with os.fdopen(fd, "wb") as f:
                f.write(text)
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)
