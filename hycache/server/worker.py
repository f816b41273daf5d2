"""The engine side of `hycache serve`: the one thread that owns the `LLM`, and stop strings.

Routes never touch the engine: they submit through `EngineWorker` (see `hycache.server.serving`)
and read its counters with `worker.call(LLM.snapshot)` (`hycache.engine.outputs`).

- `EngineWorker`: the only thread that touches the `LLM`. Handlers never call the engine; they
  put commands on a thread-safe inbox and get results back on per-request asyncio queues
  (filled with `loop.call_soon_threadsafe`). The worker sleeps on the inbox while nothing is
  unfinished and steps the engine while anything is. One submission may carry several engine
  requests (the `n` choices of one HTTP request, see `fan_out`): they are queued all or none
  and report on one queue, each event naming its request.
- `StopStrings`: a request's stop strings, checked on its decoded output by the worker right
  after each step. On a match the request is ended at once (`LLM.finish`: nothing more is
  computed) and its last event is cut to the token that completed the stop string, with the
  text cut before the stop string and finish reason "stop".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from hycache.engine.engine import LLM
from hycache.engine.outputs import StreamEvent
from hycache.request import RequestStatus, SamplingParams
from hycache.server.protocol import MAX_SEED

log = logging.getLogger("hycache.serve")

SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class Accepted:
    """The engine queued the request(s)."""


@dataclass(frozen=True)
class Failed:
    """The request was refused (400), the engine failed (500) or is shutting down (503)."""

    status: int
    message: str


Item = Accepted | Failed | StreamEvent


def fan_out(request_id: str, params: SamplingParams, n: int) -> list[tuple[str, SamplingParams]]:
    """The engine requests of `n` choices: one is `request_id` itself; several are
    `request_id-i`, choice i seeded `seed + i` when a seed is given (reproducible, yet
    different), else each by its own id."""
    if n == 1:
        return [(request_id, params)]
    return [
        (
            f"{request_id}-{i}",
            params
            if params.seed is None
            else dataclasses.replace(params, seed=(params.seed + i) % MAX_SEED),
        )
        for i in range(n)
    ]


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest of `stops` begins in `text` (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class StopStrings:
    """One request's stop strings, checked on the whole decoded output after each step (so a
    stop string split across tokens is found)."""

    def __init__(self, decode: Callable[[list[int]], str | None], stops: Sequence[str]) -> None:
        self.decode = decode
        self.stops = tuple(stops)
        self.ids: list[int] = []

    def push(self, new_ids: Sequence[int]) -> tuple[int, str] | None:
        """None while no stop string occurs; else how many of `new_ids` to keep (through the
        token that completes the first stop string) and the output text before it."""
        start = len(self.ids)
        self.ids.extend(new_ids)
        text = self.decode(self.ids) or ""
        at = _first_stop(text, self.stops)
        if at is None:
            return None
        for j in range(start + 1, len(self.ids)):  # several new tokens: find the first match
            prefix = self.decode(self.ids[:j]) or ""
            cut = _first_stop(prefix, self.stops)
            if cut is not None:
                return j - start, prefix[:cut]
        return len(self.ids) - start, text[:at]


class _Channel:
    """The worker's way back to one handler: an asyncio queue on the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Item] = asyncio.Queue()

    def put(self, item: Item) -> None:
        """Thread-safe; a no-op once the handler's loop is closed (nobody is listening)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True)
class _Add:
    requests: tuple[tuple[str, SamplingParams], ...]
    prompt: str | list[int]
    channel: _Channel
    prefix_hints: tuple[int, ...] = ()
    cache_salt: str | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class _Call:
    """Run `fn(llm)` on the worker thread (between steps) and resolve `future` with it."""

    fn: Callable[[LLM], Any]
    future: Future[Any]


_STOP = object()
_DRAIN = object()


class ServerClosed(RuntimeError):
    """The worker is stopped (or not started): no new work is taken."""


class EngineWorker:
    """The single thread that owns an `LLM`; everything else talks to it through `submit`,
    `abort` and `call`, which are safe from any thread."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders `_open` against commands entering the inbox
        self._open = False
        self._thread: threading.Thread | None = None
        self._channels: dict[str, _Channel] = {}  # worker thread only
        self._stops: dict[str, StopStrings] = {}  # worker thread only
        self._broken: str | None = None  # worker thread only: why the engine is unusable
        self._draining = False  # worker thread only: refusing new requests

    # -- any thread ----------------------------------------------------------------------------

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("EngineWorker: already started")
            self._open = True
            self._thread = threading.Thread(target=self._run, name="hycache-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 60.0) -> bool:
        """Stop taking work, abort what is unfinished, end the thread; True once it has ended.

        Handlers still waiting get a 503 failure instead of hanging."""
        with self._lock:
            if self._open:
                self._open = False
                self._inbox.put(_STOP)
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("engine thread did not stop within %ss", timeout)
            return False
        return True

    def drain(self) -> None:
        """Begin shutting down without waiting: abort every unfinished request (its handler
        gets a 503) and refuse new ones; `stop` still ends the thread."""
        with contextlib.suppress(ServerClosed):
            self._put(_DRAIN)

    def _put(self, cmd: Any) -> None:
        with self._lock:
            if not self._open:
                raise ServerClosed("the server is not running or is shutting down")
            self._inbox.put(cmd)

    def submit(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        prefix_hints: Sequence[int] = (),
        cache_salt: str | None = None,
        stop: Sequence[str] = (),
    ) -> asyncio.Queue[Item]:
        """Queue one request; see `submit_many`."""
        return self.submit_many([(request_id, params)], prompt, prefix_hints, cache_salt, stop)

    def submit_many(
        self,
        requests: Sequence[tuple[str, SamplingParams]],
        prompt: str | list[int],
        prefix_hints: Sequence[int] = (),
        cache_salt: str | None = None,
        stop: Sequence[str] = (),
    ) -> asyncio.Queue[Item]:
        """Queue engine requests `(request_id, params)` of one prompt, all or none; call from a
        running event loop. The returned queue gets `Accepted` or `Failed` first, then every
        request's `StreamEvent`s until each has had a `finished` one. `prefix_hints` and
        `cache_salt` go to `LLM.add_request`; `stop` strings end a request (see `StopStrings`;
        they need the engine's tokenizer)."""
        channel = _Channel(asyncio.get_running_loop())
        cmd = _Add(tuple(requests), prompt, channel, tuple(prefix_hints), cache_salt, tuple(stop))
        self._put(cmd)
        return channel.queue

    def abort(self, *request_ids: str) -> None:
        """Abort requests (a no-op for those already finished, or if the worker is stopped)."""
        with contextlib.suppress(ServerClosed):
            self._put(_Abort(request_ids))

    def call(self, fn: Callable[[LLM], Any]) -> Future[Any]:
        """Run `fn(llm)` on the worker thread between steps."""
        future: Future[Any] = Future()
        self._put(_Call(fn, future))
        return future

    # -- worker thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                busy = self._broken is None and self.llm.has_unfinished()
                try:
                    cmd = self._inbox.get(block=not busy)  # sleeps while idle
                except queue.Empty:
                    cmd = None
                while cmd is not None:  # take every pending command before the next step
                    if cmd is _STOP:
                        return
                    if cmd is _DRAIN:
                        self._draining = True
                        self._fail_all(503, SHUTTING_DOWN)
                    else:
                        self._handle(cmd)
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self._broken is None and self.llm.has_unfinished():
                    self._step()
        except BaseException:  # pragma: no cover - a bug in the loop itself
            log.exception("engine worker crashed")
            raise
        finally:
            self._shutdown()

    def _handle(self, cmd: Any) -> None:
        if isinstance(cmd, _Add):
            self._add(cmd)
        elif isinstance(cmd, _Abort):
            for rid in cmd.request_ids:
                self._stops.pop(rid, None)
                if self._channels.pop(rid, None) is not None:
                    self._abort(rid)
        elif isinstance(cmd, _Call):
            if not cmd.future.set_running_or_notify_cancel():
                return
            try:
                cmd.future.set_result(cmd.fn(self.llm))
            except Exception as e:
                cmd.future.set_exception(e)

    def _add(self, cmd: _Add) -> None:
        if self._broken is not None:
            cmd.channel.put(Failed(500, self._broken))
            return
        if self._draining:
            cmd.channel.put(Failed(503, SHUTTING_DOWN))
            return
        added: list[str] = []
        try:
            for rid, params in cmd.requests:
                self.llm.add_request(
                    cmd.prompt,
                    params,
                    request_id=rid,
                    cache_salt=cmd.cache_salt,
                    prefix_hints=cmd.prefix_hints,
                )
                added.append(rid)
        except Exception as e:
            for rid in added:
                self._abort(rid)
            if isinstance(e, ValueError):  # refused; the engine keeps nothing of it
                cmd.channel.put(Failed(400, str(e)))
            else:
                log.exception("add_request failed")
                cmd.channel.put(Failed(500, f"engine error: {e}"))
            return
        for rid in added:
            self._channels[rid] = cmd.channel
            if cmd.stop:
                self._stops[rid] = StopStrings(self.llm.decode, cmd.stop)
        cmd.channel.put(Accepted())

    def _abort(self, request_id: str) -> None:
        try:
            self.llm.abort(request_id)
        except Exception:
            log.exception("abort(%s) failed", request_id)

    def _step(self) -> None:
        try:
            events = self.llm.step()
        except Exception as e:
            # The engine's state is unknown: fail every live request rather than hang them.
            log.exception("engine step failed")
            self._fail_all(500, f"engine error: {e}")
            if self.llm.has_unfinished():  # could not even abort: stop stepping
                self._broken = f"engine unusable after an error: {e}"
            return
        for event in events:
            rid = event.request_id
            channel = self._channels.get(rid)
            if channel is None:  # aborted by its handler in the meantime
                continue
            if event.error is not None:  # this request alone failed: end its siblings too
                self._fail_channel(channel, f"engine error in this request: {event.error}")
                continue
            stops = self._stops.get(rid)
            if stops is not None:
                event = self._check_stop(event, stops)
            channel.put(event)
            if event.finished:
                del self._channels[rid]
                self._stops.pop(rid, None)

    def _check_stop(self, event: StreamEvent, stops: StopStrings) -> StreamEvent:
        """`event`, or, when it completes a stop string, the request's last event (the engine
        ends the request here, through the token that completed it, if it had not finished)."""
        hit = stops.push(event.new_token_ids)
        if hit is None:
            return event
        keep, text = hit
        rid = event.request_id
        n = len(stops.ids) - len(event.new_token_ids) + keep  # output tokens to keep
        out = event.output
        if out is None:
            out = self.llm.finish(rid, RequestStatus.FINISHED_STOPPED, n)
        lps = event.new_logprobs
        output = dataclasses.replace(
            out,
            token_ids=out.token_ids[:n],
            text=text,
            finish_reason="stop",
            logprobs=out.logprobs[:n] if out.logprobs is not None else None,
        )
        return StreamEvent(
            rid, event.new_token_ids[:keep], True, output, lps[:keep] if lps is not None else None
        )

    def _fail_channel(self, channel: _Channel, message: str) -> None:
        """Fail one submission (its handler gets a 500), aborting its other choices; every
        other request goes on."""
        ids = [rid for rid, c in self._channels.items() if c is channel]
        for rid in ids:
            del self._channels[rid]
            self._stops.pop(rid, None)
            self._abort(rid)  # a no-op for the failed one, which the engine ended
        channel.put(Failed(500, message))

    def _fail_all(self, status: int, message: str) -> None:
        ids = [*self._channels, *self.llm.unfinished_ids()]
        for rid in dict.fromkeys(ids):
            self._abort(rid)
        for channel in {id(c): c for c in self._channels.values()}.values():
            channel.put(Failed(status, message))
        self._channels.clear()
        self._stops.clear()

    def _shutdown(self) -> None:
        self._fail_all(503, SHUTTING_DOWN)
        with self._lock:
            self._open = False
        while True:  # nothing is put after _STOP, but answer anything left regardless
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                cmd.channel.put(Failed(503, SHUTTING_DOWN))
            elif isinstance(cmd, _Call) and cmd.future.set_running_or_notify_cancel():
                cmd.future.set_exception(ServerClosed(SHUTTING_DOWN))
