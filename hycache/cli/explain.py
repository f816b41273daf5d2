"""`hycache explain`: its flags and command (the work is hycache.sim.explain, or
hycache.bench.vllm.explain for `--backend vllm`)."""

from __future__ import annotations

import argparse
import json

from hycache.cli.args import CacheArgs, UserError, add_cache_flags, add_flag, prefix_hints
from hycache.cli.tables import console, explain_table
from hycache.config import POLICY_NAMES
from hycache.sim.build import build_config
from hycache.sim.explain import ExplainInputs


def inputs_from_cli_args(cache: CacheArgs, args: argparse.Namespace) -> ExplainInputs:
    """What explain runs; a bare `--prefix-hint` names the shared prefix P."""
    hints = prefix_hints(args.prefix_hint)
    tokens = (args.shared_prefix,) if hints.shared else ()
    return ExplainInputs(
        cache.geometry.knobs,
        eagle=cache.eagle,
        prompt_tokens=args.prompt_tokens,
        shared_prefix=args.shared_prefix,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_hints=(*tokens, *hints.tokens),
    )


def run_vllm(inputs: ExplainInputs, policy: str | None, model: str | None) -> dict[str, object]:
    from hycache.bench.vllm.reference import NEMOTRON_H, available

    if policy:
        raise SystemExit("hycache explain: --policy applies to --backend hycache only")
    if not available():
        raise SystemExit(
            "hycache explain --backend vllm: vllm is not installed here; `make setup` "
            "installs vLLM 0.33.0 (pip install vllm==0.33.0 --no-deps, then "
            "requirements/vllm.txt) and 0.34.0 (in .vllm-0.34: put it first on PYTHONPATH)"
        )
    from hycache.bench.vllm.explain import explain_vllm

    return explain_vllm(inputs, model or NEMOTRON_H)  # ValueError: a block size vLLM refuses


def cmd_explain(args: argparse.Namespace) -> int:
    from hycache.sim.explain import explain

    cache = CacheArgs.from_cli_args(args)
    inputs = inputs_from_cli_args(cache, args)
    policies = (args.policy,) if args.policy else POLICY_NAMES
    # validate the geometry through the config before running anything
    build_config(
        cache.geometry,
        policy=policies[0],
        max_model_len=args.prompt_tokens + 8,
        num_blocks=10**6,
    )
    if args.backend == "vllm":
        result = run_vllm(inputs, args.policy, args.model)
    elif args.model:
        raise UserError(
            "hycache explain: --model applies to --backend vllm only (hycache's explain is "
            "model-free: its positions depend on B, u, T and P alone)"
        )
    else:
        result = explain(inputs, tuple(policies))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(explain_table(result))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hycache.bench.vllm.reference import MODELS  # vllm-free: vLLM is imported when it runs

    p = sub.add_parser("explain", help="where siblings and resends resume, per policy")
    add_cache_flags(p)
    p.add_argument("--prompt-tokens", type=int, required=True, help="producer prompt length T")
    p.add_argument("--shared-prefix", type=int, required=True, help="shared prefix length P")
    p.add_argument("--policy", choices=POLICY_NAMES, default=None, help="one policy (default all)")
    add_flag(p, "--prefix-hint")
    p.add_argument(
        "--backend",
        choices=("hycache", "vllm"),
        default="hycache",
        help="hycache: one column per policy; vllm: vLLM's real scheduler (0.33 or 0.34), stock "
        "beside hycache.vllm.Scheduler (needs vllm installed)",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="--backend vllm: the hybrid whose KV cache config vLLM's scheduler gets (default "
        "nemotron-h-8b: one Mamba2 group; qwen3-next-80b-a3b: three GDN groups, with vLLM's "
        "block size 576 on Hopper: pass --block-size 576)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_explain)
