"""A real fleet on 127.0.0.1 for tests/fleet: NATS, Dynamo's frontend and three hycache
workers on `tiny` (EAGLE on), started once per module and stopped by the fixture's finalizer.
Skipped, with the reason, only where Dynamo or nats-server is not installed (`make setup`
installs both)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hycache.fleet.launch import Fleet, FleetSpec, dynamo_missing

WHY = dynamo_missing()
UNIT = 16
ENGINE_ARGS = (
    "--model", "tiny", "--block-size", "32", "--prefix-match-unit", str(UNIT),
    "--num-speculative-tokens", "2", "--no-warmup", "--max-model-len", "1024",
)  # fmt: skip


def start_fleet(routing: str, workdir: Path) -> Iterator[Fleet]:
    if WHY is not None:
        pytest.skip(WHY)
    spec = FleetSpec(workers=3, routing=routing, engine_args=ENGINE_ARGS, unit=UNIT)
    fleet = Fleet(spec, workdir, timeout=300.0)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def kv_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from start_fleet("kv", tmp_path_factory.mktemp("kv-fleet"))


@pytest.fixture(scope="module")
def exact_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    yield from start_fleet("exact", tmp_path_factory.mktemp("exact-fleet"))
