"""What a run reports when it breaks an invariant."""

from __future__ import annotations


class SimFailure(AssertionError):
    """A broken invariant; ``kind`` names it (shrinking keeps the kind)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
