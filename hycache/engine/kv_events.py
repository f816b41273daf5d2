"""Publishing the engine's KV events over ZMQ, framed as vLLM frames them.

    publisher = publish_kv_events(llm, "tcp://127.0.0.1:5557")   # a PUB socket, bound
    ... llm.step() ...        # after each step: drain `llm.kv_events(mode)`, publish the batch
    publisher.close()

Each message is multipart `(topic, sequence, payload)`: the topic's bytes, the sequence number
as 8 bytes big-endian (from 0), the msgpack `KVEventBatch` (`hycache.cache.events`), which is
what a vLLM engine with `--kv-events-config` sends and what Dynamo's `KvEventPublisher`
relays from a `zmq_endpoint`. `wire` picks the consumer's encoding (`hycache.cache.events.
encode_batch`): "vllm" (the default; vLLM's decoder, the `full` mode's tail included) or
"dynamo" (exactly the three fields Dynamo 1.6.1 decodes; the tail left out). No replay
socket: a subscriber that joins late sees only what follows (a fresh log opens with
`AllBlocksCleared`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from hycache.cache.event_log import EventMode
from hycache.cache.events import WIRES, KVEventBatch, Wire, encode_batch
from hycache.sched.scheduler import SchedulerOutput

if TYPE_CHECKING:
    from hycache.engine.engine import LLM


class ZmqEventPublisher:
    """A ZMQ PUB socket bound to `endpoint` (e.g. `tcp://127.0.0.1:5557`; port `*`: any free
    one, see `bound_endpoint`) that sends KV event
    batches with vLLM's framing, each encoded for `wire`. Use it from one thread (ZMQ sockets
    are not thread-safe)."""

    def __init__(self, endpoint: str, topic: str = "", wire: Wire = "vllm") -> None:
        if wire not in WIRES:
            raise ValueError(f"wire: one of {', '.join(WIRES)}, got {wire!r}")
        self.endpoint = endpoint
        self.wire: Wire = wire
        self.topic = topic.encode()
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self._seq = 0
        # the step observer `publish_kv_events` added
        self.observer: Callable[[SchedulerOutput], None] | None = None

    def publish(self, batch: KVEventBatch) -> int:
        """Send one batch; returns its sequence number."""
        seq = self._seq
        payload = encode_batch(batch, self.wire)
        self._socket.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._seq += 1
        return seq

    @property
    def bound_endpoint(self) -> str:
        """The endpoint bound (a `tcp://127.0.0.1:*` endpoint resolved to its port)."""
        return self._socket.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def num_published(self) -> int:
        return self._seq

    def close(self) -> None:
        self._socket.close()
        self._ctx.term()


def publish_kv_events(
    llm: LLM,
    endpoint: str,
    mode: EventMode = "resumable",
    topic: str = "",
    wire: Wire = "vllm",
) -> ZmqEventPublisher:
    """Bind a publisher at `endpoint` and publish `llm.kv_events(mode)`, encoded for `wire`,
    after every step that changed something (a step observer, on the engine's thread;
    `stop_publishing(llm, publisher)` stops it)."""
    publisher = ZmqEventPublisher(endpoint, topic, wire)
    log = llm.kv_events(mode)

    def observe(_: SchedulerOutput) -> None:
        batch = log.drain()
        if batch is not None:
            publisher.publish(batch)

    publisher.observer = observe
    llm.add_step_observer(observe)
    return publisher


def stop_publishing(llm: LLM, publisher: ZmqEventPublisher) -> None:
    """Stop what `publish_kv_events` started (on the engine's thread): its observer, its
    socket."""
    if publisher.observer is not None:
        llm.remove_step_observer(publisher.observer)
        publisher.observer = None
    publisher.close()
