"""The executable spec: a ledger of cache objects and the request-level step function.

One protocol (``LedgerModel``), one ledger per granularity (docs/design.md): paged
blocks identified by their token prefix (``BlockLedger``), shared prefix
records (``RecordLedger``), and byte-sized entries with a retention score
(``EntryLedger``). ``LedgerModel(config, semantics)`` builds the one
``semantics.granularity`` names.
"""

from .base import Content, LedgerModel, Step, validate
from .block import BlockLedger
from .keyed import EntryLedger, KeyedLedger, RecordLedger

__all__ = [
    "BlockLedger",
    "Content",
    "EntryLedger",
    "KeyedLedger",
    "LedgerModel",
    "RecordLedger",
    "Step",
    "validate",
]
