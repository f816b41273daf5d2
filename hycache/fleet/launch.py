"""Starting and stopping a fleet on 127.0.0.1: a NATS server, Dynamo's frontend, hycache
workers and (for the exact router) hycache's router, each a process group of its own.

    with Fleet(FleetSpec(workers=3, routing="kv"), workdir) as fleet:
        fleet.url            # the frontend's OpenAI surface
        fleet.kill_worker(0) # SIGKILL
        fleet.stop_worker(1) # SIGTERM, then wait

Everything binds the loopback (`dynamo_env`); discovery is a fresh directory under `workdir`
(`DYN_FILE_KV`), so no instance of an earlier run is ever seen. `close` stops everything it
started (SIGTERM, then SIGKILL of the whole group after `grace` seconds).

Routing modes: `kv` (Dynamo's KV router, fed the workers' events), `round-robin` (Dynamo's),
and `exact` (the frontend round-robins to one hycache router, `hycache.fleet.router`, which
asks the workers for their resume points; the workers then register the model in a namespace
of their own, out of the frontend's sight, and publish `events` for the router's view,
`resumable` by default).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROUTINGS = ("kv", "round-robin", "exact")
LOOPBACK = "127.0.0.1"
# how often the frontend may send a request elsewhere when its worker cannot be reached or
# dies mid-stream (Dynamo's migration): a dead worker then costs no request
MIGRATION_LIMIT = 3


class FleetError(RuntimeError):
    """A process of the fleet did not come up (its log's tail is in the message)."""


def dynamo_missing() -> str | None:
    """Why a fleet cannot start here (None: it can): Dynamo or nats-server not installed."""
    import importlib.util

    if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
        return "NVIDIA Dynamo is not installed (make setup installs ai-dynamo 1.6.1)"
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (make setup installs Debian's, as root)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def dynamo_env(discovery_dir: Path, nats_port: int) -> dict[str, str]:
    """The environment of every Dynamo process of one fleet: file discovery in
    `discovery_dir`, TCP requests, NATS events, every socket on the loopback."""
    return {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(discovery_dir),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "nats",
        "NATS_SERVER": f"nats://{LOOPBACK}:{nats_port}",
        "DYN_TCP_RPC_HOST": LOOPBACK,
        "DYN_EVENT_PLANE_HOST": LOOPBACK,
        "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK,
        "DYN_SYSTEM_HOST": LOOPBACK,
        "HF_HUB_OFFLINE": "1",
        "DYN_LOG": os.environ.get("DYN_LOG", "info"),
    }


@dataclass(frozen=True)
class FleetSpec:
    """What to start. `engine_args`: `hycache fleet worker` flags for every worker (the
    model's and the cache's); `events`: the workers' event mode (`hycache fleet worker
    --events`)."""

    workers: int = 3
    routing: str = "kv"
    model_name: str = "tiny"
    engine_args: tuple[str, ...] = ("--model", "tiny")
    events: str = "resumable"
    unit: int = 16  # the frontend's --kv-cache-block-size: the workers' prefix-match unit
    namespace: str = "hycache"
    frontend_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()  # `hycache fleet router` flags (routing "exact")

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing: one of {', '.join(ROUTINGS)}, got {self.routing!r}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _file: IO[bytes] = field(repr=False)

    def tail(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-n:]
        return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float) -> None:
        """SIGTERM the group, wait up to `grace` s, then SIGKILL it; reap the process."""
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        self.signal(signal.SIGKILL)  # whatever it left in its group too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace)
        self._file.close()


class Fleet:
    """A running fleet (see the module docstring); a context manager."""

    def __init__(
        self, spec: FleetSpec, workdir: Path, *, timeout: float = 240.0, grace: float = 20.0
    ) -> None:
        self.spec, self.workdir, self.timeout, self.grace = spec, workdir, timeout, grace
        self.discovery = workdir / "discovery"
        self.procs: list[Proc] = []
        self.workers: list[Proc] = []
        self.nats_port = free_port()
        self.http_port = free_port()
        self.env = {**os.environ, **dynamo_env(self.discovery, self.nats_port)}
        self.url = f"http://{LOOPBACK}:{self.http_port}"

    # -- starting --------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> Proc:
        log = self.workdir / f"{name}.log"
        f = log.open("wb")
        popen = subprocess.Popen(
            list(argv),
            env=self.env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a whole
        )
        proc = Proc(name, popen, log, f)
        self.procs.append(proc)
        return proc

    def _wait(self, what: str, ready: Any, procs: Sequence[Proc]) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            for p in procs:
                if not p.alive():
                    raise FleetError(f"{p.name} exited ({p.popen.returncode}):\n{p.tail()}")
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
                raise FleetError(f"{what}: not ready within {self.timeout:.0f} s\n{tails}")
            time.sleep(0.2)

    def start(self) -> Fleet:
        spec = self.spec
        self.discovery.mkdir(parents=True, exist_ok=True)
        nats = self._spawn(
            "nats",
            [
                "nats-server",
                "-a",
                LOOPBACK,
                "-p",
                str(self.nats_port),
                "-js",
                "-sd",
                str(self.workdir / "nats"),
            ],
        )
        self._wait("nats-server", lambda: _port_open(self.nats_port), [nats])
        exact = spec.routing == "exact"
        py = sys.executable
        card = ["--card-dir", str(self.workdir / "card")]  # one card: the frontend compares
        worker_ns = worker_namespace(spec)
        for i in range(spec.workers):
            argv = [py, "-m", "hycache", "fleet", "worker", *spec.engine_args, *card]
            argv += ["--namespace", worker_ns, "--events", spec.events]
            argv += ["--served-model-name", spec.model_name]
            self.workers.append(self._spawn(f"worker{i}", argv))
        self._wait("workers", lambda: all(_ready(w) for w in self.workers), self.workers)
        if exact:
            router = self._spawn(
                "router",
                [py, "-m", "hycache", "fleet", "router", "--namespace", spec.namespace,
                 "--worker-namespace", worker_ns, "--served-model-name", spec.model_name,
                 "--model", _model_of(spec), "--prefix-match-unit", str(spec.unit), *card,
                 *spec.router_args],
            )  # fmt: skip
            self._wait("router", lambda: _ready(router), [router])
        mode = "round-robin" if exact else spec.routing
        self._spawn(
            "frontend",
            [py, "-m", "dynamo.frontend", "--router-mode", mode, "--http-host", LOOPBACK,
             "--http-port", str(self.http_port), "--kv-cache-block-size", str(spec.unit),
             "--namespace", spec.namespace, "--migration-limit", str(MIGRATION_LIMIT),
             *spec.frontend_args],
        )  # fmt: skip
        self._wait("frontend", self._serves_model, self.procs)
        return self

    def _serves_model(self) -> bool:
        try:
            doc = self.get_json("/v1/models")
        except (OSError, ValueError):
            return False
        return any(m.get("id") == self.spec.model_name for m in doc.get("data", []))

    def get_json(self, path: str, timeout: float = 5.0) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return dict(json.loads(r.read()))

    # -- the workers -----------------------------------------------------------------------------

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker `i`'s process group (a crash: it deregisters nothing)."""
        w = self.workers[i]
        w.signal(signal.SIGKILL)
        w.popen.wait(self.grace)

    def stop_worker(self, i: int) -> int:
        """SIGTERM worker `i` and wait for it to exit; its exit status."""
        w = self.workers[i]
        w.signal(signal.SIGTERM)
        return w.popen.wait(self.timeout)

    def registered_instances(self) -> list[str]:
        """The discovery directory's entries (files), relative paths in sorted order."""
        return sorted(
            str(p.relative_to(self.discovery)) for p in self.discovery.rglob("*") if p.is_file()
        )

    def decisions(self) -> dict[str, Decision]:
        """Every routing decision so far, by request id (the OpenAI response's id after its
        `cmpl-` / `chatcmpl-` prefix): Dynamo's KV router's, read from the frontend's log
        (its matched blocks times the block size), or hycache's router's, from its log."""
        if self.spec.routing == "exact":
            router = next(p for p in self.procs if p.name == "router")
            return parse_decisions(router.tail(1 << 30), 1)
        frontend = next(p for p in self.procs if p.name == "frontend")
        return parse_decisions(frontend.tail(1 << 30), self.spec.unit)

    # -- stopping --------------------------------------------------------------------------------

    def close(self) -> None:
        for p in reversed(self.procs):  # the frontend first, NATS last
            p.stop(self.grace)

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Decision:
    """Where a request went and the hit its router predicted there (tokens)."""

    worker_id: int
    predicted: int


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Dynamo's frontend, per routed request (its second request_id is the OpenAI response's)
_KV_ROUTED = re.compile(
    r"route request completed.*request_id=(?P<id>[0-9a-f-]{36}) .*"
    r"overlap_blocks=(?P<blocks>\d+) .*worker_id=(?P<worker>\d+)"
)
# hycache's router (`hycache.fleet.router.ExactRouter`)
_EXACT_ROUTED = re.compile(
    r"hycache route request_id=(?P<id>\S+) worker_id=(?P<worker>\d+) "
    r"resume_point=(?P<blocks>\d+)"
)


def parse_decisions(log: str, block: int) -> dict[str, Decision]:
    """The routing decisions in a frontend's or hycache router's log (the last for an id)."""
    out: dict[str, Decision] = {}
    for line in _ANSI.sub("", log).splitlines():
        m = _KV_ROUTED.search(line) or _EXACT_ROUTED.search(line)
        if m is not None:
            out[m["id"]] = Decision(int(m["worker"]), int(m["blocks"]) * block)
    return out


def request_key(response_id: str) -> str:
    """The id the routers log for an OpenAI response id (`cmpl-<uuid>` -> `<uuid>`)."""
    return (
        response_id.split("-", 1)[1]
        if response_id.startswith(("cmpl-", "chatcmpl-"))
        else response_id
    )


READY_LINE = b"hycache fleet worker ready"
ROUTER_READY_LINE = b"hycache fleet router ready"


def _ready(p: Proc) -> bool:
    with contextlib.suppress(OSError):
        data = p.log.read_bytes()
        return READY_LINE in data or ROUTER_READY_LINE in data
    return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((LOOPBACK, port)) == 0


def worker_namespace(spec: FleetSpec) -> str:
    """The workers' Dynamo namespace: the fleet's, or behind hycache's router one of their
    own, out of the frontend's sight (`hycache.fleet.router`)."""
    return f"{spec.namespace}-workers" if spec.routing == "exact" else spec.namespace


def _model_of(spec: FleetSpec) -> str:
    args = list(spec.engine_args)
    return args[args.index("--model") + 1] if "--model" in args else "tiny"
