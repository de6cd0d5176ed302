"""Slurm's own formats, parsed in one place for every edge: the shims (``sbatch -t``,
``--mem``, ``-n``), the CLI (``corral submit --time 5`` is five minutes, as for every
Slurm user) and the API's ``walltime`` where it is written in Slurm's colon forms.

What each form means is Slurm 22.05's (``time_str2secs``, ``str_to_mbytes`` and
sbatch's task arithmetic in src/common), checked on the private Slurm:

- time: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``0``, ``-1``,
  ``UNLIMITED`` and ``INFINITE`` (any case) ask for no limit, which the partition's
  maximum then bounds (``NO_LIMIT``). sbatch keeps whole minutes: seconds round up.
- memory: a number with an optional K/M/G/T suffix (M by default, K rounds up);
  ``--mem=0`` asks for the whole node (``WHOLE_NODE``); ``--mem-per-cpu`` is multiplied
  by the CPUs allocated (tasks x CPUs per task).
- tasks: ``-n`` tasks of ``-c`` CPUs each, on ``-N`` nodes (``--ntasks-per-node``
  multiplies out when ``-n`` is not given).

Imports nothing beyond ``re``: a shim call pays for this module on every invocation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NO_LIMIT = -1
"""A time limit of 0/UNLIMITED/INFINITE: no limit of the job's own (the partition's maximum)."""
WHOLE_NODE = 0
"""``--mem=0``: all the memory of the node (the partition's maximum per job)."""

_INFINITE = {"-1", "infinite", "unlimited"}
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM_RE = re.compile(r"^(\d+)([KMGTkmgt])?[Bb]?$")
_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def time_seconds(text: str, whole_minutes: bool = True) -> int:
    """Slurm's time limit in seconds, or ``NO_LIMIT``. Raises ValueError on anything
    else. ``whole_minutes``: round seconds up to minutes, as sbatch does."""
    t = str(text).strip()
    if t.lower() in _INFINITE:
        return NO_LIMIT
    m = _TIME_RE.match(t)
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time: write minutes (30), MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                         "D-HH:MM:SS or UNLIMITED")
    days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        secs = int(days) * 86400 + a * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        secs = a * 3600 + int(b or 0) * 60 + int(c)
    elif b is not None:  # M:S
        secs = a * 60 + int(b)
    else:  # M
        secs = a * 60
    if secs == 0:
        return NO_LIMIT  # sbatch: "a time limit of zero requests that no time limit be imposed"
    if whole_minutes:
        secs = -(-secs // 60) * 60
    return secs


def memory_mb(text: str) -> int:
    """Slurm's memory size in MB (``WHOLE_NODE`` for 0). Raises ValueError otherwise."""
    m = _MEM_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a Slurm memory size: write 500M, 4G, 1T or MB as a number")
    n, unit = int(m.group(1)), (m.group(2) or "M").upper()
    if unit == "K":
        return -(-n // 1024)
    return int(n * _MB[unit])


@dataclass(frozen=True)
class Shape:
    """A job's size as sbatch computes it: tasks, CPUs per task, nodes."""

    ntasks: int = 1
    cpus_per_task: int = 1
    nodes: int = 1

    @property
    def cpus(self) -> int:
        return self.ntasks * self.cpus_per_task


def _count(text: str | int | None, flag: str) -> int | None:
    if text is None:
        return None
    t = str(text).strip()
    if not t.isdigit() or int(t) < 1:  # Slurm's own words: a count is a whole number from 1
        raise ValueError(f'Invalid numeric value "{text}" for {flag}.')
    return int(t)


def shape(ntasks: str | int | None = None, cpus_per_task: str | int | None = None, nodes: str | None = None,
          ntasks_per_node: str | int | None = None) -> Shape:
    """-n, -c, -N (``N`` or ``MIN-MAX``) and --ntasks-per-node as one Shape. Raises
    ValueError naming the flag."""
    n_nodes = 1
    if nodes is not None:
        lo, _, hi = str(nodes).partition("-")
        lo_n = _count(lo, "--nodes")
        hi_n = _count(hi, "--nodes") if hi else lo_n
        if lo_n is None or hi_n is None or hi_n < lo_n:
            raise ValueError(f'Invalid node count specification "{nodes}" for --nodes.')
        n_nodes = lo_n
    per_node = _count(ntasks_per_node, "--ntasks-per-node")
    tasks = _count(ntasks, "--ntasks")
    if tasks is None:
        tasks = (per_node or 1) * n_nodes
    return Shape(tasks, _count(cpus_per_task, "--cpus-per-task") or 1, n_nodes)


def format_limit(seconds: int | float) -> str:
    """A limit as squeue's %l and sinfo print it: M:SS, H:MM:SS, D-HH:MM:SS."""
    s = int(seconds)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{sec:02d}"
    if h:
        return f"{h}:{m:02d}:{sec:02d}"
    return f"{m}:{sec:02d}"


def memory_text(mb: int | float) -> str:
    """A size in MB as Slurm prints it (squeue %m, TRES, ReqMem): 500M, 2G, 1.50G, 62.50G;
    it moves to the next unit while no precision is lost (a multiple of 512)."""
    num, units, i = float(mb), "MGTPE", 0
    while num >= 1024 and int(num) % 512 == 0 and i < len(units) - 1:
        num /= 1024
        i += 1
    return f"{num:.2f}{units[i]}" if num != int(num) else f"{int(num)}{units[i]}"


_ARRAY_RE = re.compile(r"^([0-9]{1,12})(?:-([0-9]{1,12})(?::([0-9]{1,12}))?)?$")
MAX_ARRAY_INDEX = 4_000_000
"""Slurm's largest array task id (MaxArraySize is at most 4000001)."""


def array_indices(text: str, limit: int = 1000) -> list[int]:
    """Slurm's --array syntax, '0-9', '1,3,5', '0-99:2' -> the task indices (at most
    ``limit``). A throttle ('%N') is refused: corral runs an array as a batch."""
    if "%" in str(text):
        raise ValueError(f"array {text!r}: a throttle (%N) is not supported; corral runs an array as one batch "
                         "and the facility's limits bound how many run; drop the %N")
    out: list[int] = []
    for part in str(text).replace(" ", "").split(","):
        m = _ARRAY_RE.match(part)
        if not m:
            if re.fullmatch(r"[0-9:-]+", part) and re.search(r"[0-9]{13}", part):
                raise ValueError(f"array {str(text)[:40]!r}...: task ids go from 0 to {MAX_ARRAY_INDEX} (Slurm's limit)")
            raise ValueError(f"array {text!r} is not Slurm's syntax; write '0-9', '1,3,5' or '0-99:2'")
        lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if hi > MAX_ARRAY_INDEX:
            raise ValueError(f"array {str(text)[:40]!r}...: task ids go from 0 to {MAX_ARRAY_INDEX} (Slurm's limit)")
        if hi < lo or step < 1:
            raise ValueError(f"array {text!r}: a range goes low-high with a positive step")
        if (hi - lo) // step + 1 + len(out) > limit:
            raise ValueError(f"array {text!r} has more than {limit} tasks; split it into several submissions")
        out += range(lo, hi + 1, step)
    return sorted(dict.fromkeys(out))
