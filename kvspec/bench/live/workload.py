"""What the two arms send: the workload's figures (N, P, S, O, C) and each arm's prompts."""

from __future__ import annotations

import random
from dataclasses import dataclass

ARMS = ("unique", "shared")


@dataclass(frozen=True)
class WorkloadShape:
    """The figures both arms share: N requests of P prompt tokens, O output tokens, C in flight."""

    requests: int = 32
    prompt_tokens: int = 256
    shared_tokens: int = 224
    output_tokens: int = 16
    concurrency: int = 4
    vocab_size: int = 1024
    seed: int = 0

    def problems(self) -> list[str]:
        """What makes this shape unusable (empty when it is fine)."""
        out = []
        if self.requests < 1 or self.concurrency < 1:
            out.append("requests and concurrency must be at least 1")
        if not 0 < self.shared_tokens < self.prompt_tokens:
            out.append("the shared prefix must be shorter than the prompt and non-empty (0 < S < P)")
        if self.output_tokens < 2:
            out.append("output tokens must be at least 2, so TPOT has a gap to measure")
        if self.vocab_size < 8:
            out.append("the vocabulary is too small for random prompts")
        return out


def make_prompts(arm: str, shape: WorkloadShape) -> list[list[int]]:
    """The arm's N prompts, each exactly P token ids, reproducible from ``shape.seed``.

    Ids 0..2 are left out (the tiny model's unk, bos and eos), so no prompt holds a special token.
    ``unique`` prompts share no first token block with each other (a collision would need equal
    random ids over a whole block); ``shared`` prompts all start with the same S ids.
    """
    rng = random.Random(f"{shape.seed}:{arm}")

    def draw(n: int) -> list[int]:
        return [rng.randrange(3, shape.vocab_size) for _ in range(n)]

    if arm == "unique":
        return [draw(shape.prompt_tokens) for _ in range(shape.requests)]
    if arm == "shared":
        prefix = draw(shape.shared_tokens)
        return [prefix + draw(shape.prompt_tokens - shape.shared_tokens) for _ in range(shape.requests)]
    raise ValueError(f"unknown arm {arm!r} (one of {', '.join(ARMS)})")
