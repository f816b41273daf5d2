"""The `vllm serve` command of docs/vllm-plugin.md, read by vLLM's parser and built into its config.

Run as `python -m tests.vllm.serve_command` with `VLLM_TARGET_DEVICE=cpu` (vLLM's config needs a
platform, picked once per process): prints, as JSON, what the flags configured and the seed
shape's hits on the scheduler that config builds. `$MODEL` becomes the packaged Nemotron-H
config (with one MTP layer); `--skip-tokenizer-init` is added, since it has no tokenizer.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "vllm-plugin.md"


def docs_command() -> list[str]:
    """The first `vllm serve` command of docs/vllm-plugin.md, as argv."""
    match = re.search(r"^vllm serve .*?(?<!\\)$", PAGE.read_text(), re.M | re.S)
    assert match, f"no `vllm serve` command in {PAGE}"
    return shlex.split(match.group(0).replace("\\\n", " "))


def main() -> None:
    import vllm.triton_utils
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import tests.vllm.conftest  # noqa: F401  (hypothesis profile, for the import below)
    from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup, _model_dir
    from hycache.config import CacheKnobs
    from tests.vllm.shapes import family, hits

    # vLLM 0.34's CPU platform refuses an x86 machine without triton-cpu while it checks the
    # config (0.33 warns); nothing here runs a kernel, and that check is the flag's only use
    # on x86 (`CpuPlatform.check_and_update_config`), so the config is built as with it
    vllm.triton_utils.HAS_TRITON = True
    argv = docs_command()
    assert argv[:3] == ["vllm", "serve", "$MODEL"], argv[:3]
    flags = argv[3:]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", _model_dir(), "--skip-tokenizer-init", *flags])
    vc = EngineArgs.from_cli_args(args).create_engine_config()
    cache, sched, spec = vc.cache_config, vc.scheduler_config, vc.speculative_config
    setup = VllmSetup(
        # vLLM sizes B at engine start (the Mamba page); the seed shape's
        CacheKnobs(4416, cache.prefix_match_unit),
        sched.max_num_batched_tokens,
        spec.num_speculative_tokens,
        scheduler_cls=sched.scheduler_cls,
    )
    out = {"flags": flags}
    for hint in (0, 57_600):
        ref = ReferenceScheduler(setup, vllm_config=vc)
        out["scheduler"] = f"{type(ref.scheduler).__module__}.{type(ref.scheduler).__name__}"
        out[f"hits_hint_{hint}"] = hits(ref.run_all(family(1, 57_600, 6_416, 4, hint=hint)))
        vc = EngineArgs.from_cli_args(args).create_engine_config()  # a fresh one per run
    import vllm

    out.update(
        vllm=vllm.__version__,
        scheduler_cls=sched.scheduler_cls,
        prefix_match_unit=cache.prefix_match_unit,
        mamba_cache_mode=cache.mamba_cache_mode,
        enable_prefix_caching=cache.enable_prefix_caching,
        speculative_method=spec.method,
        num_speculative_tokens=spec.num_speculative_tokens,
        num_hash_lookahead_tokens=vc.num_hash_lookahead_tokens,
        max_num_batched_tokens=sched.max_num_batched_tokens,
    )
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
