"""Device readiness: the engine on CUDA (when present) against CPU float32 greedy, and bf16
weights with float32 SSM state (on CPU always, on CUDA when present).

The CUDA tests are skipped on machines without a GPU; the CPU bf16 smoke test always runs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from hycache.engine.engine import LLM
from hycache.model.paged import StepBatch
from hycache.request import SamplingParams

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(length + 7 * i)] for i in range(n)]


def _generate(device: str, dtype: str = "float32", **kw: object) -> list[list[int]]:
    llm = LLM(
        "tiny",
        device=device,
        dtype=dtype,
        max_model_len=512,
        block_size=16,
        prefix_match_unit=4,
        **kw,  # type: ignore[arg-type]
    )
    outs = llm.generate(_prompts(4, 150), SamplingParams(max_tokens=24, ignore_eos=True))
    return [o.token_ids for o in outs]


@pytest.fixture
def exact_cuda() -> Iterator[None]:
    """No TF32 in CUDA matmuls / convolutions while comparing against CPU float32."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@cuda
@pytest.mark.usefixtures("exact_cuda")
@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "cache"])
def test_cuda_greedy_equals_cpu(caching: bool) -> None:
    cpu = _generate("cpu", enable_prefix_caching=caching)
    gpu = _generate("cuda", enable_prefix_caching=caching)
    assert gpu == cpu


@cuda
@pytest.mark.usefixtures("exact_cuda")
def test_cuda_speculative_equals_cpu_plain() -> None:
    assert _generate("cuda", num_speculative_tokens=3) == _generate("cpu")


@cuda
def test_cuda_decode_step_has_no_host_sync() -> None:
    """A decode forward (plans built, every layer run) never waits on the device."""
    llm = LLM("tiny", device="cuda", max_model_len=256, block_size=16, prefix_match_unit=4)
    model, runner = llm.model, llm.runner
    assert runner.kv is not None and runner.states is not None
    n = 4
    prefill = StepBatch(
        input_ids=torch.arange(n * 20, device="cuda") % 500,
        positions=torch.arange(20, device="cuda").repeat(n),
        query_lens=[20] * n,
        context_lens=[0] * n,
        block_tables=[[2 * r, 2 * r + 1] for r in range(n)],
        state_src=[-1] * n,
        state_writes=[[(20, r + 1)] for r in range(n)],
    )
    model.forward(prefill, runner.kv, runner.states)
    decode = StepBatch(
        input_ids=torch.arange(n, device="cuda"),
        positions=torch.full((n,), 20, device="cuda"),
        query_lens=[1] * n,
        context_lens=[20] * n,
        block_tables=[[2 * r, 2 * r + 1] for r in range(n)],
        state_src=[r + 1 for r in range(n)],
        state_writes=[[(1, r + 1)] for r in range(n)],
    )
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hidden = model.forward(decode, runner.kv, runner.states)
        model.compute_logits(hidden)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _bf16_smoke(device: str) -> None:
    llm = LLM(
        "tiny", device=device, dtype="bfloat16", max_model_len=512, block_size=16,
        prefix_match_unit=4,
    )  # fmt: skip
    assert llm.model.dtype == torch.bfloat16
    states = llm.runner.states
    assert states is not None and states.ssm.dtype == torch.float32  # the SSM state stays fp32
    assert states.conv.dtype == torch.bfloat16
    outs = llm.generate(_prompts(3, 90), SamplingParams(max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12, 12, 12]
    assert all(0 <= t < 512 for o in outs for t in o.token_ids)
    assert torch.isfinite(states.ssm).all()


def test_cpu_bf16_smoke() -> None:
    _bf16_smoke("cpu")


@cuda
def test_cuda_bf16_smoke() -> None:
    _bf16_smoke("cuda")
