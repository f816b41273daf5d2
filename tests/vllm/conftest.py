"""The vLLM reference tests need vLLM 0.33 or 0.34 (`make setup` installs both: 0.33 in the
venv, 0.34 in `.vllm-0.34`, put first on `PYTHONPATH` by `make test-vllm-0.34`); hypothesis
profiles; the vLLM version in pytest's header."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from hycache.bench.vllm.reference import available

# default suite: 25 examples per property; `HYCACHE_VLLM_EXAMPLES=300 pytest tests/vllm` for
# the long run the closing notes quote
settings.register_profile(
    "vllm-reference",
    max_examples=int(os.environ.get("HYCACHE_VLLM_EXAMPLES", "25")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

if not available():
    if os.environ.get("HYCACHE_SKIP_VLLM") != "1":
        raise pytest.UsageError(
            "tests/vllm need vllm 0.33 or 0.34 (make setup installs them); HYCACHE_SKIP_VLLM=1 "
            "skips them"
        )
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header() -> str:
    if not available():
        return "vllm: not installed (tests/vllm skipped)"
    import vllm

    return f"vllm: {vllm.__version__} ({os.path.dirname(vllm.__file__)})"
