"""When a copy may touch KV pages: after the kernels queued before it.

A store reads a layer's KV pages once its attention wrote them; a load
writes pages that earlier kernels may still read. ``ComputeOrder`` is the one
place that orders a mover's copies after the forward pass, for every device:

* CPU: the forward runs on the thread that asks for the copy, so program
  order is the order -- ``mark()`` returns None and the copy runs at once;
* CUDA: ``mark()`` records an event on the current (compute) stream, and the
  copy's side stream waits for it (``wait``) before it touches a page, as
  vLLM's own offloading handlers do. The copy is then asynchronous to the
  caller; its completion is polled, never a device-wide sync.

The CUDA branch is three calls (event, record, wait_event) and has not run
on a GPU yet (no machine with one was lent): the GPU issue runs it. Tests
drive the shared logic on CPU with an order whose marks complete later.
"""

from __future__ import annotations

import torch


class ComputeOrder:
    """Marks taken on the compute side, waited for on the copy side."""

    def __init__(self, device: torch.device, stream=None) -> None:
        self.cuda = device.type == "cuda"
        self.stream = stream

    def mark(self):
        """A token for "everything queued so far on the compute side", or
        None when that is already done (CPU)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record()  # on the current stream: the forward's
        return ev

    def wait(self, mark) -> None:
        """Makes the copy side wait for `mark` (call inside the copy stream's
        context; a no-op for None)."""
        if mark is not None:
            self.stream.wait_event(mark)
