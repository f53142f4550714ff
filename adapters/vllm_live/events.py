"""The KV cache event stream of a vLLM server: a ZMQ SUB subscriber that never loses a batch silently.

vLLM publishes one message per engine step, ``[topic, seq, payload]``: seq is an 8-byte big-endian
counter, payload a msgpack array ``[ts, [event, ...], dp_rank]`` whose events are maps tagged by
``"type"`` (BlockStored, BlockRemoved, AllBlocksCleared). The invariant kept here: the batches handed
out are in seq order with no gap, except where the replay socket (ZMQ ROUTER: send ``[b"", start_seq]``
from a DEALER, it answers with the buffered batches, then seq -1) no longer holds the missing ones; such
a gap is then passed on as it is, and the ledger's ``event_sequence_contiguous`` check reports it.
Payloads are decoded with msgspec's msgpack decoder into plain lists and dicts, never unpickled.
pyzmq and msgspec are vLLM's dependencies, not the kit's: they are imported by name when used.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

END_OF_REPLAY = -1


def decode_batch(seq_bytes: bytes, payload: bytes) -> dict[str, Any]:
    """One recorded batch line: ``{"seq", "ts", "events", "dp_rank"}`` from a message's last two frames."""
    msgspec: Any = importlib.import_module("msgspec")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    body = msgspec.msgpack.decode(payload)
    ts, events = body[0], body[1]
    dp_rank = body[2] if len(body) > 2 else None
    return {"seq": seq, "ts": float(ts), "events": [dict(e) for e in events], "dp_rank": dp_rank}


class EventSubscriber:
    """Collects batches on a background thread; :meth:`wait_for` blocks until the stream has caught up.

    ``start_seq``: the first seq expected (0 for a server started by the kit: a late subscriber's
    missing first batches are fetched from the replay socket); None to start at the first batch seen.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        start_seq: int | None = 0,
        record: TextIO | None = None,
        on_batch: Callable[[dict[str, Any]], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> None:
        zmq: Any = importlib.import_module("zmq")
        self._zmq = zmq
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.batches: list[dict[str, Any]] = []
        self.gaps: list[tuple[int, int]] = []  # [first missing, first present) that replay could not fill
        self.replayed = 0
        self._next: int | None = start_seq
        self._record, self._on_batch, self._on_gap = record, on_batch, on_gap
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name="kvspec-kv-events", daemon=True)

    def start(self) -> EventSubscriber:
        self._thread.start()
        return self

    @property
    def last_seq(self) -> int | None:
        with self._lock:
            return self.batches[-1]["seq"] if self.batches else None

    def _accept(self, batch: dict[str, Any]) -> None:
        with self._lock:
            if self._next is not None and batch["seq"] < self._next:
                return  # already have it (a replay overlapping the live stream)
            self._next = batch["seq"] + 1
            self.batches.append(batch)
            if self._record is not None:
                self._record.write(json.dumps(batch) + "\n")
            if self._on_batch is not None:
                self._on_batch(batch)
            self._lock.notify_all()

    def _replay(self, start: int, stop: int) -> None:
        """Fetch batches [start, stop) from the replay socket, in order; what it lacks stays a gap."""
        zmq = self._zmq
        if self.replay_endpoint is None:
            self._lost(start, stop)
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        got: list[dict[str, Any]] = []
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while dealer.poll(2000):
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_OF_REPLAY:
                    break
                if start <= seq < stop:
                    got.append(decode_batch(frames[-2], frames[-1]))
        finally:
            dealer.close()
        got.sort(key=lambda b: b["seq"])
        expected = start
        for batch in got:
            if batch["seq"] != expected:
                break
            self._accept(batch)
            self.replayed += 1
            expected += 1
        if expected < stop:
            self._lost(expected, stop)

    def _lost(self, start: int, stop: int) -> None:
        """Batches [start, stop) are gone for good: say so, and accept the live batch after the hole."""
        self.gaps.append((start, stop))
        if self._on_gap is not None:
            self._on_gap(start, stop)
        with self._lock:
            self._next = stop

    def _run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            if not dict(poller.poll(100)):
                continue
            frames = self._sub.recv_multipart()
            batch = decode_batch(frames[-2], frames[-1])
            with self._lock:
                expected = self._next
            if expected is not None and batch["seq"] > expected:
                self._replay(expected, batch["seq"])
            self._accept(batch)

    def wait_for(self, seq: int, timeout: float = 10.0) -> bool:
        """Block until batch ``seq`` has been accepted (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._next is None or self._next <= seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def wait_quiet(self, quiet_s: float = 0.3, timeout: float = 10.0) -> None:
        """Block until no batch has arrived for ``quiet_s`` (the engine has no step left to publish)."""
        deadline = time.monotonic() + timeout
        count = -1
        while time.monotonic() < deadline:
            with self._lock:
                now = len(self.batches)
            if now == count:
                return
            count = now
            time.sleep(quiet_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._sub.close()
        self._ctx.term()
