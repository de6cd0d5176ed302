"""``scancel`` and ``sinfo`` through corral."""

from __future__ import annotations

import functools
import re
import sys

from corral.edges import acts
from corral.edges.shims.base import ACTIVE, Parser, ShimError, client, facility, unsupported, user
from corral.edges.shims.nodes import busy_nodes, expand_ids, partition_rows
from corral.edges.shims.queue import parse_states, views


@functools.lru_cache(maxsize=None)
def _scancel_parser() -> Parser:
    """Built once per process (the shim helper builds it before forking)."""
    p = Parser(prog="scancel", allow_abbrev=True)
    a = p.add_argument
    a("ids", nargs="*")
    a("-u", "--user")
    a("--me", action="store_true")
    a("-n", "--name", "--jobname")
    a("-t", "--state")
    a("-p", "--partition")
    a("-s", "--signal")
    a("-b", "--batch", action="store_true")
    a("-f", "--full", action="store_true")
    a("-H", "--hurry", action="store_true")
    a("-Q", "--quiet", action="store_true")
    a("-v", "--verbose", action="store_true")
    a("-i", "--interactive", action="store_true")
    return p


def scancel(argv: list[str]) -> int:
    p = _scancel_parser()
    ns = p.parse_args(argv)
    if ns.signal or ns.batch or ns.full:
        unsupported("scancel", "--signal/--batch/--full", "signal a job with corral control ID signal -s NAME")
    if ns.interactive:
        unsupported("scancel", "--interactive")
    if ns.user and set(ns.user.split(",")) - {user()}:
        unsupported("scancel", f"--user={ns.user}", "corral cancels your own jobs (and your agents')")
    c = client()
    filtered = bool(ns.user or ns.me or ns.name or ns.state or ns.partition)
    if not ns.ids and not filtered:
        raise ShimError("No job identification provided")
    for raw in ns.ids:
        if not raw.split("_")[0].split(".")[0].isdigit():
            raise ShimError(f"Invalid job id {raw}")
    ns.ids = expand_ids(ns.ids)  # ID_[1-3,5]: those tasks, as Slurm's scancel takes them
    vs = views(ns.ids or None, parse_states(ns.state) if ns.state else None,
               set(ns.partition.split(",")) if ns.partition else None,
               set(ns.name.split(",")) if ns.name else None, active_only=False)
    if ns.ids and ns.verbose:
        found = {str(v.j["id"]) for v in vs} | {v.jobid for v in vs} | {str(v.array_id) for v in vs}
        for raw in ns.ids:
            if raw.split(".")[0] not in found:
                # Slurm 22.05's scancel says nothing and exits 0 for an id it does not know, unless -v
                print(f"scancel: error: Kill job error on job id {raw}: Invalid job id specified", file=sys.stderr)
    targets = [v.j["id"] for v in vs if v.state in ACTIVE]
    if targets:
        c.run(acts.cancel_many, targets)
    return 0


@functools.lru_cache(maxsize=None)
def _sinfo_parser() -> Parser:
    """Built once per process (the shim helper builds it before forking)."""
    p = Parser(prog="sinfo", allow_abbrev=True)
    a = p.add_argument
    a("-h", "--noheader", action="store_true")
    a("-s", "--summarize", action="store_true")
    a("-p", "--partition")
    a("-o", "--format")
    a("-N", "--Node", action="store_true")
    a("-l", "--long", action="store_true")
    a("-a", "--all", action="store_true")
    a("-e", "--exact", action="store_true")
    a("-O", "--Format")
    a("-R", "--list-reasons", action="store_true")
    a("-t", "--states")
    a("-v", "--verbose", action="store_true")
    a("--json", action="store_true")
    return p


def sinfo(argv: list[str]) -> int:
    p = _sinfo_parser()
    ns = p.parse_args(argv)
    for flag in ("Node", "long", "Format", "list_reasons", "states", "json"):
        if getattr(ns, flag):
            unsupported("sinfo", "--" + flag.replace("_", "-"), "corral reports partitions: corral facility")
    fac = facility(client())
    parts = fac.get("partitions") or []
    if ns.partition:
        want = set(ns.partition.split(","))
        parts = [x for x in parts if x["name"] in want]
    busy = busy_nodes(fac.get("partitions") or [], views(None, {"RUNNING"}, None, None, False))
    by_state = not ns.summarize and not (ns.format and not re.search(r"%[.\d-]*[tT]", ns.format))
    rows = []
    for x in parts:  # a row per state where the state is printed, else one per partition
        rows += partition_rows(x, busy, not by_state)
    if ns.format:
        from corral.edges.shims.queue import FORMAT_SPEC

        heads = {"P": "PARTITION", "a": "AVAIL", "l": "TIMELIMIT", "D": "NODES", "T": "STATE", "t": "STATE",
                 "N": "NODELIST",
                 "F": "NODES(A/I/O/T)", "c": "CPUS", "m": "MEMORY", "G": "GRES", "R": "PARTITION"}
        specs = list(FORMAT_SPEC.finditer(ns.format))
        for m in specs:
            if m[4] not in heads:
                unsupported("sinfo", f"the format field %{m[4]}")

        def fmt(get: "object") -> str:
            out, pos = [], 0
            for m in specs:
                out.append(ns.format[pos:m.start()])
                text = get(m[4])  # type: ignore[operator]
                if m[3]:
                    w = int(m[3])
                    text = text[:w].rjust(w) if m[1] else text[:w].ljust(w)
                out.append(text)
                pos = m.end()
            out.append(ns.format[pos:])
            return "".join(out)

        if not ns.noheader:
            print(fmt(lambda k: heads[k]))
        lines = [fmt(lambda k, r=r: r["P"].rstrip("*") if k == "R" else r[k]) for r in rows]
        print("\n".join(dict.fromkeys(lines)))  # rows alike in every field printed are one, as in Slurm's

        return 0
    if ns.summarize:
        head = f"{'PARTITION':<9} {'AVAIL':>5} {'TIMELIMIT':>10} {'NODES(A/I/O/T)':>16} NODELIST"
        body = [f"{r['P']:<9} {r['a']:>5} {r['l']:>10} {r['F']:>16} {r['N']}" for r in rows]
    else:
        head = f"{'PARTITION':<9} {'AVAIL':>5} {'TIMELIMIT':>10} {'NODES':>6} {'STATE':>6} NODELIST"
        body = [f"{r['P']:<9} {r['a']:>5} {r['l']:>10} {r['D']:>6} {r['t']:>6} {r['N']}" for r in rows]
    if not ns.noheader:
        print(head)
    print("\n".join(body))
    return 0
