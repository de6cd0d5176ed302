"""What sinfo prints of nodes, and the array-task sets scancel takes: the node names in
Slurm's compressed form (``c[1-2,4]``), a partition's nodes grouped by state (a node
with a job of the caller's on it is ``mixed``, ``allocated`` once those jobs take all its
CPUs; the others ``idle``), and ``ID_[1-3]``
expanded to its tasks."""

from __future__ import annotations

import re
from typing import Any

from corral.edges.shims.base import ShimError, limit

_NUMBERED = re.compile(r"(.*?)(\d+)")


def compress(names: list[str]) -> str:
    """['c1', 'c2', 'c4'] -> 'c[1-2,4]'; a single node, or names without a number, as they are."""
    groups: dict[str, list[int]] = {}
    plain: list[str] = []
    for n in names:
        m = _NUMBERED.fullmatch(n)
        if m:
            groups.setdefault(m[1], []).append(int(m[2]))
        else:
            plain.append(n)
    out = list(plain)
    for prefix, nums in groups.items():
        nums.sort()
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]}")
            continue
        runs: list[list[int]] = []
        for i in nums:
            if runs and i == runs[-1][-1] + 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        out.append(prefix + "[" + ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) + "]")
    return ",".join(out)


def expand(text: str) -> list[str]:
    """'c[1-2,4]' -> ['c1', 'c2', 'c4'] (one bracket; plain names as they are)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", text):
        prefix, ranges = m[1], m[2]
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            a, _, b = part.partition("-")
            out += [f"{prefix}{i}" for i in range(int(a), int(b or a) + 1)] if a.isdigit() else []
    return out


def busy_nodes(parts: list[dict[str, Any]], running: list[Any]) -> dict[str, int]:
    """The nodes a job of the caller's runs on, with the CPUs those jobs take there: its own
    node as its lane said, else (a lane that does not say) every node of its partition."""
    by_part = {x["name"]: x.get("nodes") or ["localhost"] for x in parts}
    out: dict[str, int] = {}
    for v in running:
        node = v.j.get("node")
        for n in expand(node) if node else by_part.get(v.partition, ["localhost"]):
            out[n] = out.get(n, 0) + v.cpus
    return out


def partition_rows(x: dict[str, Any], busy: dict[str, int], summarize: bool) -> list[dict[str, str]]:
    """sinfo's rows of one partition: one per node state (mixed first, then idle), or with
    -s one row counting them (A/I/O/T)."""
    nodes = x.get("nodes") or ["localhost"]
    cpus = x.get("node_cpus") or {}
    full = [n for n in nodes if n in busy and busy[n] >= int(cpus.get(n) or 1 << 30)]
    mixed = [n for n in nodes if n in busy and n not in full]
    idle = [n for n in nodes if n not in busy]
    base = {"P": x["name"] + ("*" if x.get("default") else ""),
            "a": "up" if (x.get("state") or "UP").upper() == "UP" else "down",
            "l": limit(x.get("max_walltime_s") or 0) if x.get("max_walltime_s") else "infinite",
            "F": f"{len(mixed) + len(full)}/{len(idle)}/0/{len(nodes)}", "c": str(x.get("max_cpus")),
            "m": str(x.get("max_memory_mb")), "G": f"gpu:{x['max_gpus']}" if x.get("max_gpus") else "(null)"}
    groups = [("mix", "mixed", mixed), ("alloc", "allocated", full), ("idle", "idle", idle)]  # Slurm's order
    if summarize:
        state = ("mix", "mixed") if mixed or (full and idle) else ("alloc", "allocated") if full else ("idle", "idle")
        groups = [state + (nodes,)]
    return [{**base, "t": short, "T": long, "D": str(len(ns)), "N": compress(ns)} for short, long, ns in groups if ns]


def expand_ids(ids: list[str]) -> list[str]:
    """scancel's 'ID_[1-3,5]' -> ['ID_1', 'ID_2', 'ID_3', 'ID_5']; other ids as they are."""
    out: list[str] = []
    for raw in ids:
        m = re.fullmatch(r"(\d+)_\[([\d,\-]+)\]", raw)
        if not m:
            out.append(raw)
            continue
        for part in m[2].split(","):
            a, _, b = part.partition("-")
            if not a.isdigit() or (b and not b.isdigit()):
                raise ShimError(f"Invalid job id {raw}")
            out += [f"{m[1]}_{i}" for i in range(int(a), int(b or a) + 1)]
    return out
