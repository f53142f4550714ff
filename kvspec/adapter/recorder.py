"""What a live adapter records (kvspec.adapter.LiveAdapter): every record kept in order, and written as JSON
lines as it comes (``--record``), from any thread."""

from __future__ import annotations

import json
import threading
from typing import Any, TextIO


class Recorder:
    """Collects records in memory (and as JSON lines in ``sink``), safe to call from several threads.

    Invariant: ``records`` and the lines written to ``sink`` are the same records in the same order."""

    def __init__(self, sink: TextIO | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self._sink = sink
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.records.append(record)
            if self._sink is not None:
                self._sink.write(json.dumps(record) + "\n")
                self._sink.flush()


__all__ = ["Recorder"]
