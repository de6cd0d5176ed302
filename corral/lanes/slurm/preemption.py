"""The preemptible tier's expected loss (issue 52 item 2, docs/decisions/0064): how often
Slurm preempts the opportunistic QOS on a cluster, and what that is expected to cost a
job in SUs spent again.

::

    observed  -> one `sacct -a -D -X` (slurmdbd, not the controller) over the site's
                 window, for the opportunistic QOS: its runs that Slurm ended by a
                 preemption (PREEMPTED, or REQUEUED: a run told of it that requeued
                 itself within its grace, decision 0058) and the hours its runs ran;
                 again every REMEASURE_S
    rate      -> preemptions per hour of running: measured, or the site's
                 ``[slurm] preemption_rate`` where the history is under
                 ``preemption_min_hours``
    expected_loss -> the SUs a run is expected to spend again before one completes

The model: preemptions come as a Poisson process at the rate λ while the job runs, and a
preempted run starts again from the beginning (a job that does not checkpoint: the
figure is what checkpointing can save). A job of T hours then runs (e^{λT} - 1)/λ hours
in expectation until one run completes; what is over T is the work lost, charged at the
same rate: ``loss = SUs x ((e^{λT} - 1)/(λT) - 1)``, about ``SUs x λT/2`` when λT is small.
The chance of at least one preemption is 1 - e^{-λT}.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from corral.core.errors import CorralError

log = logging.getLogger(__name__)

LOST = ("PREEMPTED", "REQUEUED")
"""How sacct ends a run that a preemption cost: past its grace, or requeued within it."""
MAX_EXPONENT = 20.0
"""λT past which the figure is held: such a job is not expected to finish between
preemptions at all (the loss is then a floor, and already dwarfs every other cost)."""


@dataclass(frozen=True)
class Rate:
    """A cluster's preemption rate, and where it comes from."""

    per_hour: float
    preempted: int
    """Runs preempted in the window (measured), 0 with the site's rate."""
    hours: float
    """Hours the opportunistic QOS's runs ran in the window."""
    source: str
    """'measured' (slurmdbd), 'site' ([slurm] preemption_rate), or 'none' (neither: 0 assumed)."""

    def public(self) -> dict[str, Any]:
        return {"per_hour": round(self.per_hour, 6), "preempted": self.preempted, "hours": round(self.hours, 6),
                "source": self.source}


def expected_loss(sus: float, walltime_s: float, per_hour: float) -> tuple[float, float]:
    """-> (the SUs expected to be spent again, the chance of at least one preemption)."""
    x = min(per_hour * walltime_s / 3600, MAX_EXPONENT)
    if x <= 0:
        return 0.0, 0.0
    return sus * (math.expm1(x) / x - 1), -math.expm1(-x)


def judged(observed: tuple[int, float] | None, min_hours: float, site: float | None) -> Rate:
    """The rate a cluster is judged by: what slurmdbd saw when its runs add up to
    ``min_hours``, else the site's (None: not set)."""
    if observed is not None and observed[1] >= min_hours and observed[1] > 0:
        return Rate(observed[0] / observed[1], observed[0], observed[1], "measured")
    hours = observed[1] if observed is not None else 0.0
    if site is not None:
        return Rate(site, 0, hours, "site")
    return Rate(0.0, 0, hours, "none")


class Preemptions:
    """What slurmdbd says of one QOS's runs over a window, asked again every REMEASURE_S
    (RETRY_S after it did not answer): a plan or a placement costs no RPC of its own."""

    REMEASURE_S = 600.0
    RETRY_S = 60.0

    def __init__(self, run: Callable[..., str], clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._clock = clock
        self._known: dict[tuple[str, float], tuple[tuple[int, float] | None, float]] = {}

    def observed(self, qos: str, window_s: float) -> tuple[int, float] | None:
        """-> (runs preempted, hours run) by ``qos`` in the last ``window_s``; None when
        slurmdbd does not answer."""
        key = (qos, window_s)
        known = self._known.get(key)
        if known is not None and self._clock() < known[1]:
            return known[0]
        try:
            text = self._run("sacct", "-a", "-D", "-X", "-n", "-P", f"--qos={qos}", "-S",
                             f"now-{max(1, int(window_s))}seconds", "-E", "now", "-o", "State,ElapsedRaw")
            got: tuple[int, float] | None = read(text)
            until = self._clock() + self.REMEASURE_S
        except CorralError as e:
            log.warning("the preemption rate of QOS %s is not known now: %s", qos, e)
            got, until = None, self._clock() + self.RETRY_S
        self._known[key] = (got, until)
        return got


def read(text: str) -> tuple[int, float]:
    """sacct's 'State|ElapsedRaw' lines -> (runs a preemption ended, hours run)."""
    lost, seconds = 0, 0
    for line in text.splitlines():
        state, _, elapsed = line.partition("|")
        lost += (state.split() or [""])[0] in LOST
        seconds += int(elapsed) if elapsed.strip().isdigit() else 0
    return lost, seconds / 3600
