"""`hycache fleet worker` and `hycache fleet router`: a hycache engine as an NVIDIA Dynamo
worker, and hycache's exact router in front of several (the fleet is `hycache.fleet`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from hycache.cli.args import EngineArgs, add_engine_args

EVENT_MODES = ("resumable", "full", "none")


def cmd_worker(args: argparse.Namespace) -> int:
    """Build the engine, register it with Dynamo, serve it until SIGTERM / SIGINT."""
    from hycache.fleet.worker import WorkerSettings, serve_worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    engine = EngineArgs.from_cli_args(args)
    try:
        llm = engine.build(warmup=not args.no_warmup)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"hycache fleet worker: {e}", file=sys.stderr)
        return 2
    settings = WorkerSettings(
        namespace=args.namespace,
        component=args.component,
        model_name=args.served_model_name or None,
        card_dir=args.card_dir,
        events=args.events,
    )
    asyncio.run(serve_worker(llm, engine.model, settings))
    return 0


def cmd_router(args: argparse.Namespace) -> int:
    """Serve hycache's exact router as the model's one Dynamo worker until SIGTERM / SIGINT."""
    from hycache.fleet.router import RouterSettings, serve_router

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    settings = RouterSettings(
        namespace=args.namespace,
        worker_namespace=args.worker_namespace,
        worker_component=args.worker_component,
        model=args.model,
        model_name=args.served_model_name,
        load_weight=args.load_weight,
        unit=args.prefix_match_unit,
        card_dir=args.card_dir,
        view=args.view,
    )
    asyncio.run(serve_router(settings))
    return 0


def _add_place(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", default="hycache", help="the Dynamo namespace of the fleet")


def _add_card_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--card-dir",
        default=None,
        help="where a preset's model card (config, tokenizer) is written for the frontend; "
        "every process of one fleet must give the same (default: one directory per preset "
        "under the system's temporary directory)",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fleet", help="a fleet of engines behind NVIDIA Dynamo (docs/fleet.md)")
    fleet = p.add_subparsers(dest="fleet_command", required=True)

    w = fleet.add_parser("worker", help="serve one engine as a Dynamo worker")
    add_engine_args(w)
    _add_place(w)
    w.add_argument("--component", default="worker", help="the Dynamo component of the workers")
    w.add_argument(
        "--served-model-name",
        default="tiny",
        help="the model name the frontend serves; empty: don't register with the frontend "
        "(behind `hycache fleet router`)",
    )
    _add_card_dir(w)
    w.add_argument(
        "--events",
        default="resumable",
        choices=EVENT_MODES,
        help="KV events for Dynamo's router: resumable (a block is stored while a request can "
        "resume past it), full (vLLM's per-group events: Dynamo drops the SSM group) or none",
    )
    w.add_argument("--no-warmup", action="store_true", help="skip the warm-up forward")
    w.set_defaults(func=cmd_worker)

    r = fleet.add_parser("router", help="serve hycache's exact router in front of the workers")
    _add_place(r)
    r.add_argument(
        "--worker-namespace",
        default=None,
        help="the workers' Dynamo namespace (default: --namespace); give them one of their own, "
        "out of the frontend's --namespace, so that the frontend sends every request here",
    )
    r.add_argument("--worker-component", default="worker", help="the workers' Dynamo component")
    r.add_argument("--model", default="tiny", help="the workers' model (its card is registered)")
    r.add_argument("--served-model-name", default="tiny", help="the model name to register")
    _add_card_dir(r)
    r.add_argument(
        "--prefix-match-unit", type=int, default=16, help="the workers' prefix-match unit"
    )
    r.add_argument(
        "--load-weight",
        type=float,
        default=1.0,
        help="tokens of resume point one queued or running request is worth",
    )
    r.add_argument(
        "--view",
        default="events",
        choices=("events", "ask-all"),
        help="events: ask only the workers whose resumable events publish a unit on the "
        "request's path (the workers run with --events resumable); ask-all: ask every worker",
    )
    r.set_defaults(func=cmd_router)
