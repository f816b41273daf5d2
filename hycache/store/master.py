"""Start and stop a `mooncake_master` on loopback (tests, benchmarks, local trials).

    with MooncakeMaster() as master:          # free loopback ports, stopped on exit
        store = MooncakeStore(master.url, 64 << 20)

The binary ships with the `mooncake-transfer-engine-non-cuda` wheel, next to the Python
interpreter (`bin/mooncake_master`) or inside the `mooncake` package.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType


def master_binary() -> str | None:
    found = shutil.which("mooncake_master")
    if found:
        return found
    beside = Path(sys.executable).parent / "mooncake_master"
    if beside.is_file():
        return str(beside)
    try:
        import mooncake
    except ImportError:
        return None
    inside = Path(mooncake.__file__).parent / "mooncake_master"
    return str(inside) if inside.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MooncakeMaster:
    """One master process listening on 127.0.0.1 only (RPC and metrics)."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        binary = master_binary()
        if binary is None:
            raise RuntimeError(
                "mooncake_master not found: pip install mooncake-transfer-engine-non-cuda"
            )
        self.binary = binary
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mooncake://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> MooncakeMaster:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                "-rpc_address",
                "127.0.0.1",
                "-rpc_port",
                str(self.port),
                "-metrics_host",
                "127.0.0.1",
                "-metrics_port",
                str(self.metrics_port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mooncake_master did not listen on 127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """Stop abruptly (a crash), as a fault test wants."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
