"""Slurm's vocabulary, translated at the edge: job states into ``JobState``, exit codes,
times and node lists. Pure functions, no Slurm needed to test them."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from corral.core import slurm_formats
from corral.core.jobs import JobState
from corral.core.safe_read import read_small

log = logging.getLogger("corral.lanes.slurm.backend")

STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESIZING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # the job ended; Slurm is still cleaning up: sacct has the outcome
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,  # holds its allocation; it resumes where it was
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,  # the node died under the job: not the job's fault, but it did not finish
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
    "REVOKED": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
}
"""Slurm job states -> JobState. sacct writes 'CANCELLED by 0': only the first word counts.
An unknown state becomes UNKNOWN and is logged."""

def translate(slurm_state: str) -> JobState:
    word = slurm_state.split()[0].rstrip("+") if slurm_state.strip() else ""
    state = STATES.get(word)
    if state is None:
        log.warning("unknown Slurm state %r: reported as UNKNOWN", slurm_state)
        return JobState.UNKNOWN
    return state


def parse_exit(code: str) -> tuple[int | None, int]:
    """sacct's 'EXIT:SIGNAL' -> (exit code, signal); a signal maps to 128+signal as in a shell."""
    try:
        rc, sig = (int(x) for x in code.split(":"))
    except ValueError:
        return None, 0
    return (128 + sig if sig else rc), sig


def parse_slurm_time(value: str) -> int | None:
    """'UNLIMITED', '1:00:00', '2-00:00:00', '30' (minutes) -> seconds; None for no limit
    (corral.core.slurm_formats reads every form)."""
    if not value or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    secs = slurm_formats.time_seconds(value, whole_minutes=False)
    return None if secs == slurm_formats.NO_LIMIT else secs


def min_job_age_s(slurm_conf: str | None) -> int:
    """slurm.conf's MinJobAge (how long slurmctld keeps an ended job); Slurm's default, 300."""
    try:
        text = Path(slurm_conf).read_text(errors="replace") if slurm_conf else ""
    except OSError:
        text = ""
    m = re.search(r"(?im)^\s*MinJobAge\s*=\s*(\d+)", text)
    return int(m.group(1)) if m else 300


def parse_kv(line: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def _read_epoch(path: Path) -> float | None:
    try:
        return float(read_small(path, 64).strip())  # the job's own claim: never a link, FIFO or device
    except (OSError, ValueError):
        return None


def slurm_epoch(text: str) -> float | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def expand_nodes(nodes: str) -> set[str]:
    """'localhost' or 'n[1-3],gpu1' -> names (enough for the common forms)."""
    out: set[str] = set()
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", nodes):
        m = re.match(r"(.*)\[(.*)\]$", part)
        if not m:
            out.add(part)
            continue
        for rng in m.group(2).split(","):
            lo, _, hi = rng.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.add(f"{m.group(1)}{str(i).zfill(len(lo))}")
    return out
