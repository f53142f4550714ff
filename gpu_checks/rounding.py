"""The rounding rule of PyTorch's CUDA caching allocator that the footprint assertions rely on.

``torch.cuda.memory_allocated()`` is the sum of the *allocator block* sizes that live
tensors occupy, not of the bytes they asked for. PyTorch documents the allocator in
"CUDA semantics > Memory management" (https://pytorch.org/docs/stable/notes/cuda.html#memory-management)
and in the comments of ``c10/cuda/CUDACachingAllocator.cpp``; the rule, for the default
("native") backend and an unset ``PYTORCH_CUDA_ALLOC_CONF``, is:

1. every request is rounded up to a multiple of 512 bytes, and to at least 512
   (``kMinBlockSize``; ``round_size``);
2. requests up to 1 MiB (``kSmallSize``) come from the small pool: 2 MiB segments that
   are split whenever at least 512 bytes remain, so such a tensor's block is exactly its
   rounded size;
3. larger requests come from the large pool, whose blocks are split only when *more than*
   1 MiB would remain; a tensor may therefore sit in a block up to 1 MiB larger than its
   rounded size (with ``expandable_segments:True`` the large pool splits at 512 bytes too);
4. ``torch.cuda.memory_stats()["requested_bytes.all.current"]`` (PyTorch 2.1 and later)
   counts the bytes asked for, unrounded.

So for ``k`` live tensors of ``b`` bytes each, the growth of ``memory_allocated`` is
exactly ``k x round_512(b)`` when ``b <= 1 MiB`` and lies in
``[k x round_512(b), k x (round_512(b) + 1 MiB)]`` otherwise; the growth of
``requested_bytes`` is exactly ``k x b``. ``roundup_power2_divisions``,
``max_split_size_mb`` and the ``cudaMallocAsync`` backend change the rule: the probe
refuses to run under them.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_ALLOC_BYTES = 1 << 20  # kSmallSize: the largest request the small pool serves
LARGE_SPLIT_SLACK_BYTES = 1 << 20  # a large block is split only when more than this remains


def round_up(nbytes: int) -> int:
    """The allocator's ``round_size``: up to a multiple of 512 bytes, at least 512."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


@dataclass(frozen=True)
class Expected:
    """What ``memory_allocated`` may grow by for ``count`` live tensors of ``nbytes`` bytes each.

    ``low == high`` when the rule is exact (small pool, or expandable segments).
    ``requested`` is the exact unrounded total.
    """

    count: int
    nbytes: int
    requested: int
    low: int
    high: int

    @property
    def exact(self) -> bool:
        return self.low == self.high

    def admits(self, measured: int) -> bool:
        """True when ``measured`` bytes of growth are what the rule allows."""
        return self.low <= measured <= self.high

    def to_json(self) -> dict[str, int | bool]:
        return {
            "count": self.count,
            "nbytes_each": self.nbytes,
            "requested": self.requested,
            "allocated_low": self.low,
            "allocated_high": self.high,
            "exact": self.exact,
        }


def expected_growth(count: int, nbytes: int, *, expandable_segments: bool = False) -> Expected:
    """The allocator growth the rule above predicts for ``count`` tensors of ``nbytes`` bytes each."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    rounded = round_up(nbytes)
    slack = 0 if nbytes <= SMALL_ALLOC_BYTES or expandable_segments else LARGE_SPLIT_SLACK_BYTES
    return Expected(
        count=count, nbytes=nbytes, requested=count * nbytes, low=count * rounded, high=count * (rounded + slack)
    )


def unsupported_alloc_conf(conf: str) -> str | None:
    """Why ``PYTORCH_CUDA_ALLOC_CONF`` (its text) breaks the rule above, or None when it keeps it."""
    options = {}
    for item in conf.replace(" ", "").split(","):
        key, _, value = item.partition(":")
        if key:
            options[key] = value
    if options.get("backend", "native") != "native":
        return f"PYTORCH_CUDA_ALLOC_CONF selects backend {options['backend']!r}; the probe models the native allocator"
    for option in ("roundup_power2_divisions", "max_split_size_mb"):
        if option in options:
            return f"PYTORCH_CUDA_ALLOC_CONF sets {option}, which the rule above does not model"
    return None


def expandable_segments(conf: str) -> bool:
    """True when ``PYTORCH_CUDA_ALLOC_CONF`` (its text) turns expandable segments on."""
    return "expandable_segments:true" in conf.replace(" ", "").lower()
