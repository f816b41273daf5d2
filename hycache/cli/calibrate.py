"""`hycache calibrate` (time the real engine, fit the cost model: hycache.bench.calibrate) and
`hycache bench --validate PROFILE` (hycache.bench.validate): their flags and commands."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from hycache.cli.args import UserError, add_flag, namespace_values, positive_int
from hycache.cli.tables import (
    console,
    cross_fit_table,
    fit_table,
    progress_reporter,
    replay_table,
    residuals_table,
    step_table,
    ttft_step_table,
    validation_table,
)
from hycache.files import check_writable, write_atomic


def cmd_calibrate(args: argparse.Namespace) -> int:
    from hycache.bench.calibrate import CalibrateOptions, calibrate

    check_writable(args.out, "--out")
    opts = CalibrateOptions(
        **namespace_values(args, "model", "threads", "repeats", "quick", "clock", "seed")
    )
    if opts.model != "tiny":
        raise UserError("--model: the engine's calibration grid is sized for `tiny`")
    command = "hycache " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    with progress_reporter("calibrating") as progress:
        profile = calibrate(opts, progress, command=f"hycache calibrate {command}".strip())
    console.print(residuals_table("fitted shapes", profile.residuals))
    console.print(residuals_table("held-out shapes (not fitted)", profile.held_out))
    console.print(fit_table(profile))
    write_atomic(args.out, json.dumps(profile.to_json(), indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """`hycache bench --validate PROFILE`."""
    from hycache.bench.calibrate import CalibrateOptions
    from hycache.bench.validate import ValidateOptions, validate

    check_writable(args.json, "--json")
    if args.raw:
        check_writable(args.raw, "--raw")
    recalibrate = None
    if args.recalibrate:
        check_writable(args.validate, "--validate")
        recalibrate = CalibrateOptions(
            threads=args.threads,
            repeats=args.calibration_repeats,
            quick=args.quick,
            clock=args.clock or "wall",
        )
    opts = ValidateOptions(
        profile=args.validate,
        threads=args.threads,
        repeats=args.engine_repeats or 1,
        quick=args.quick,
        clock=args.clock,
        cross_fit=not args.no_cross_fit,
        interleave=not args.no_interleave,
        acceptance=args.acceptance,
        round_every=args.round_every,
        raw=args.raw,
    )
    with progress_reporter("validating") as progress:
        report = validate(opts, progress, recalibrate)
    if report.profile is not None:
        console.print(residuals_table("fitted shapes (pooled rounds)", report.profile.residuals))
        console.print(residuals_table("held-out shapes (not fitted)", report.profile.held_out))
        console.print(fit_table(report.profile))
        console.print(f"wrote {args.validate}")
    console.print(validation_table(report))
    if report.inputs.cross_fitted:
        console.print(cross_fit_table(report))
    if report.inputs.acceptance == "replay":
        console.print(replay_table(report))
    console.print(step_table(report))
    console.print(ttft_step_table(report))
    miss = report.misses()
    console.print(
        "within the targets (10% on tok/s and TTFT p50, 3 pp on the ratio)"
        if not miss
        else "outside the targets: " + "; ".join(miss)
    )
    console.print(f"validation wall time: {report.wall_s:.1f} s")
    if args.json:
        write_atomic(args.json, json.dumps(report.to_json(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def add_validate_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("validation")
    g.add_argument(
        "--validate",
        default=None,
        metavar="PROFILE",
        help="instead: the simulator with this calibrated profile (`hycache calibrate`) "
        "against the CPU engine on the system-prompt, family and multi-turn workloads, "
        "lookahead and limit (writes --json when given a file other than the default)",
    )
    g.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure the calibration grid before each engine repeat (the calibration and "
        "the runs it predicts then see the machine in the same states), fit the pooled "
        "rounds and write PROFILE from them",
    )
    g.add_argument(
        "--calibration-repeats",
        type=positive_int,
        default=3,
        help="with --recalibrate: repeats per shape in each round (default 3)",
    )
    g.add_argument(
        "--round-every",
        type=positive_int,
        default=1,
        help="with --recalibrate: a calibration round before every N-th engine repeat "
        "(default 1: before each)",
    )
    g.add_argument(
        "--no-cross-fit",
        action="store_true",
        help="with --recalibrate: predict every workload with the probes' fit alone (by "
        "default each is predicted with the probes and the other workloads' engine steps "
        "fitted, the probes-only prediction beside it)",
    )
    g.add_argument(
        "--no-interleave",
        action="store_true",
        help="run each repeat's policies one after the other (by default their engines run "
        "in one process, one step each in turn, each timed on its own clock, so the ratio "
        "sees the machine in the same states)",
    )
    g.add_argument(
        "--acceptance",
        choices=("replay", "rate"),
        default="replay",
        help="the simulator replays the drafts each engine run accepted (default; the "
        "prediction drawing them at the profile's rate is shown beside it), or draws them",
    )
    g.add_argument(
        "--raw",
        default=None,
        metavar="PATH",
        help="validation: pickle the calibration rounds and every engine step here (to refit)",
    )
    g.add_argument("--threads", type=positive_int, default=1, help="torch threads (validation)")
    g.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default=None,
        help="validation: time both sides by this clock (default: the profile's)",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time the real engine over a grid of step shapes and fit the cost model",
        description="Run the engine on this device over prefill, decode, verify and mixed "
        "step shapes (and block copies, state writes), fit the simulator's cost model, and "
        "write a device profile that `hycache simulate --gpu-config` accepts.",
    )
    p.add_argument("--model", default="tiny", help="the engine model (tiny)")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    p.add_argument("--repeats", type=positive_int, default=5, help="repeats per shape")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="fit the wall time, or the process CPU time (a machine shared with other work)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny grid (a smoke test)")
    add_flag(p, "--seed")
    p.set_defaults(func=cmd_calibrate)
