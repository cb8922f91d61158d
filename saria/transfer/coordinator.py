"""Timing model of a reload that reads some blocks from DRAM and some from SSD.

Both paths end in the GPU and share its ingress link (PCIe x16). DRAM copies
from pinned memory can fill that link alone; SSD reads through GPUDirect
Storage run at the drives' aggregate read rate, capped by the link. Three
coordinator modes (SARIA §4.5):

* ``serial``  -- DRAM part, then SSD part: ``d / B_dram + s / B_ssd``.
* ``overlap`` -- both start at once. DRAM copies from pinned memory can fill
  the link alone, and while they run the SSD (GDS) path progresses at only a
  share ``contention_ssd_share`` of its alone rate; DRAM gets the rest of the
  link. The DRAM copies usually finish first and leave a disk-only tail --
  the effect SARIA's coordinator exists for (paper §4.5). The share is an
  assumption (default 0.5): the paper measures the tail but not the rate.
  With share 1 this is an ideal link arbiter, and an overlap split at the
  balanced DRAM share is then already optimal.
* ``paced``   -- the coordinator paces DRAM copies while SSD reads are in
  flight: the SSD path runs at full speed, DRAM gets the residual
  ``(L - B_ssd) * efficiency``, and full speed again once no SSD work
  remains. ``efficiency`` < 1 models the cost of pacing (copies issued in
  throttled chunks): with several SSDs the residual is small and pacing can
  cost more than it saves, which is why pacing is a choice.

All rates in bytes/s, sizes in bytes, results in seconds. The model is a
two-phase fluid computation: exact for constant rates.
"""

from __future__ import annotations

from dataclasses import dataclass

COORDINATOR_MODES = ("serial", "overlap", "paced")


@dataclass(frozen=True, slots=True)
class LinkModel:
    """Bandwidths of one GPU's reload paths.

    ``ingress_Bps``: the GPU's ingress link (PCIe x16 H2D); ``dram_Bps``: a
    DRAM -> GPU copy alone (pinned ~ link rate, pageable ~0.4x); ``ssd_Bps``:
    aggregate SSD read rate into the GPU (drives x per-drive read, through
    GDS, or bounced through DRAM without it); ``pacing_efficiency``: share of
    the residual ingress paced DRAM copies actually use;
    ``contention_ssd_share``: share of its alone rate the SSD path keeps while
    unpaced DRAM copies fill the link.
    """

    ingress_Bps: float
    dram_Bps: float
    ssd_Bps: float
    pacing_efficiency: float = 1.0
    contention_ssd_share: float = 0.5

    def __post_init__(self) -> None:
        for name in ("ingress_Bps", "dram_Bps", "ssd_Bps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.pacing_efficiency <= 1:
            raise ValueError(f"pacing_efficiency must be in (0, 1], got {self.pacing_efficiency}")
        if not 0 < self.contention_ssd_share <= 1:
            raise ValueError("contention_ssd_share must be in (0, 1], got "
                             f"{self.contention_ssd_share}")

    @property
    def dram_alone(self) -> float:
        return min(self.dram_Bps, self.ingress_Bps)

    @property
    def ssd_alone(self) -> float:
        return min(self.ssd_Bps, self.ingress_Bps)


def paced_dram_rate(link: LinkModel, dram_bytes: float, ssd_bytes: float) -> float:
    """The pacing rule: the DRAM copy rate while SSD reads are in flight.

    At most the ingress the SSD path leaves (the residual, times the pacing
    efficiency), and no faster than finishing together with the SSD part
    (``dram_bytes / (ssd_bytes / B_ssd)``): a DRAM copy done early buys
    nothing while the reload waits for its SSD part, and the ingress it does
    not take is left to other requests' DRAM copies. Either way the reload
    itself completes at the same time. The vLLM worker paces its copies with
    this rule; 0 means the SSD path alone fills the link (DRAM waits).
    """
    residual = max(min(link.dram_alone, link.ingress_Bps - link.ssd_alone), 0.0)
    residual *= link.pacing_efficiency
    if ssd_bytes <= 0:
        return link.dram_alone
    ssd_time = ssd_bytes / link.ssd_alone
    if ssd_time <= 0:  # a vanishing SSD part (underflow): nothing to finish with
        return residual
    return min(residual, dram_bytes / ssd_time)


def reload_time(dram_bytes: float, ssd_bytes: float, link: LinkModel, mode: str = "paced") -> float:
    """Seconds until the last byte of a DRAM+SSD reload has reached the GPU."""
    if dram_bytes < 0 or ssd_bytes < 0:
        raise ValueError("reload sizes must not be negative")
    rd, rs = link.dram_alone, link.ssd_alone
    if ssd_bytes == 0:
        return dram_bytes / rd
    if dram_bytes == 0:
        return ssd_bytes / rs
    if mode == "serial":
        return dram_bytes / rd + ssd_bytes / rs
    if mode == "overlap":
        if rd + rs > link.ingress_Bps:  # DRAM copies fill the link: SSD slowed
            s_rate = rs * link.contention_ssd_share
            d_rate = min(rd, link.ingress_Bps - s_rate)
        else:
            d_rate, s_rate = rd, rs
    elif mode == "paced":
        s_rate = rs
        d_rate = paced_dram_rate(link, dram_bytes, ssd_bytes)
        if d_rate <= 0:  # the SSDs alone fill the link: DRAM waits
            return ssd_bytes / rs + dram_bytes / rd
    else:
        raise ValueError(f"unknown coordinator mode {mode!r}; valid: {', '.join(COORDINATOR_MODES)}")
    # Phase 1: both paths run; phase 2: the survivor runs alone at full rate.
    t_d, t_s = dram_bytes / d_rate, ssd_bytes / s_rate
    if t_d <= t_s:
        left = ssd_bytes - s_rate * t_d
        return t_d + left / rs
    left = dram_bytes - d_rate * t_s
    return t_s + left / rd


class ReloadQueue:
    """Reloads of successive requests on one GPU's ingress, in arrival order.

    ``serial`` and ``overlap``: the link is one FIFO resource; a reload starts
    when the previous one has fully finished. ``paced``: the coordinator keeps
    the SSD path at full speed and gives the DRAM path's residual ingress to
    whoever needs it, so a DRAM-only reload can start while an earlier
    request's SSD read is still in flight -- at the residual rate until that
    read ends, then at the full DRAM rate (SARIA §4.5: "residual ingress can
    advance other DRAM-only requests"). Reloads that read from the SSD stay
    FIFO behind every earlier reload.
    """

    def __init__(self, link: LinkModel, mode: str) -> None:
        if mode not in COORDINATOR_MODES:
            raise ValueError(f"unknown coordinator mode {mode!r}; valid: "
                             f"{', '.join(COORDINATOR_MODES)}")
        self.link = link
        self.mode = mode
        self.dram_free = 0.0  # the DRAM path takes new work from this time
        self.ssd_free = 0.0   # the SSD path (and with it the paced residual) ends here

    def submit(self, t: float, dram_bytes: float, ssd_bytes: float) -> float:
        """A reload requested at time `t`; returns when its last byte lands."""
        link = self.link
        if dram_bytes == 0 and ssd_bytes == 0:
            return t
        if self.mode != "paced":
            start = max(t, self.dram_free, self.ssd_free)
            done = start + reload_time(dram_bytes, ssd_bytes, link, self.mode)
            self.dram_free = self.ssd_free = done
            return done
        rd, rs = link.dram_alone, link.ssd_alone
        if ssd_bytes == 0:  # DRAM-only: may ride the residual of an SSD read
            start = max(t, self.dram_free)
            residual = max(min(rd, link.ingress_Bps - rs), 0.0) * link.pacing_efficiency
            if start < self.ssd_free and residual > 0:
                early = min(dram_bytes, residual * (self.ssd_free - start))
                done = start + early / residual if early == dram_bytes else \
                    self.ssd_free + (dram_bytes - early) / rd
            else:
                done = max(start, self.ssd_free) + dram_bytes / rd
            self.dram_free = done
            return done
        start = max(t, self.dram_free, self.ssd_free)
        done = start + reload_time(dram_bytes, ssd_bytes, link, "paced")
        ssd_done = start + ssd_bytes / rs
        d_rate = min(rd, link.ingress_Bps - rs) * link.pacing_efficiency
        dram_done = start + dram_bytes / d_rate if d_rate > 0 and dram_bytes <= d_rate * (
            ssd_done - start) else done
        self.ssd_free = ssd_done
        self.dram_free = dram_done
        return done
