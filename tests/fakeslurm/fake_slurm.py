#!/usr/bin/env python3
"""A fake Slurm for laptops: sbatch, squeue, sacct, scancel, scontrol and sinfo as one
script (a shim per name on PATH, written by tests/fakeslurm/__init__.py), over a state
directory beside $SLURM_CONF. Jobs really run: each under corral's local supervisor
(corral.lanes.local_runner), which enforces walltime and memory, so the backend
contract suite means the same here as on the real Slurm of scripts/slurm-up.

It speaks only the subset of each command's flags and output formats that corral's
Slurm backend uses. The conf holds NodeName= and PartitionName= lines as slurm.conf
does, and ``FakeSecondsPerMinute=N`` (default 60): Slurm's --time is in minutes, and a
test should not wait a real one. Never a replacement for the real Slurm tests.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

CONF = Path(os.environ.get("SLURM_CONF", "slurm.conf"))
STATE = CONF.parent / "fake-state"


def conf() -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {"nodes": [], "parts": [], "opts": []}
    for line in CONF.read_text().splitlines():
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "NodeName" in kv:
            out["nodes"].append(kv)
        elif "PartitionName" in kv:
            out["parts"].append(kv)
        elif kv:
            out["opts"].append(kv)
    return out


def minute_s() -> float:
    return float(next((o["FakeSecondsPerMinute"] for o in conf()["opts"] if "FakeSecondsPerMinute" in o), 60))


def new_id() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "next_id", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or "1000")
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
        return n


def jobs() -> list[Path]:
    return sorted((STATE / "jobs").glob("*"), key=lambda p: int(p.name)) if (STATE / "jobs").is_dir() else []


def record(d: Path) -> dict[str, object]:
    meta = json.loads((d / "meta.json").read_text())
    result = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
    running = json.loads((d / "running.json").read_text()) if (d / "running.json").exists() else None
    return {**meta, "result": result, "running": running}


def stamp(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"


def sbatch(args: list[str]) -> None:
    if "--test-only" in args:  # this fake starts every job at once
        print(f"sbatch: Job {new_id()} to start at {stamp(time.time())} using 1 processors on nodes fake1 in "
              "partition debug", file=sys.stderr)
        return
    script = Path(args[-1])
    text = script.read_text()
    opts = dict(m.groups() for m in re.finditer(r"^#SBATCH --([a-z-]+)=(.*)$", text, re.M))
    # options on the command line win over #SBATCH lines, as in sbatch (corral puts --chdir there)
    opts.update(dict(m.groups() for a in args[:-1] if (m := re.fullmatch(r"--([a-z-]+)=(.*)", a))))
    part = opts.get("partition") or next(p["PartitionName"] for p in conf()["parts"] if p.get("Default") == "YES")
    h, m, s = (int(x) for x in opts.get("time", "01:00:00").split(":"))
    jid = new_id()
    d = STATE / "jobs" / str(jid)
    d.mkdir(parents=True)
    output = {name: opts.get(key, str(d / f"{name}.log")) for name, key in (("stdout", "output"), ("stderr", "error"))}
    comment = opts.get("comment", "").strip("'")
    (d / "meta.json").write_text(json.dumps({"id": jid, "name": opts.get("job-name", script.name), "comment": comment,
                                             "partition": part, "submit": time.time()}))
    limit = (h * 60 + m + (1 if s else 0)) * minute_s()
    (d / "launch.json").write_text(json.dumps({
        "argv": ["bash", str(script)], "cwd": opts.get("chdir", str(d)), "env": dict(os.environ), "output": output,
        "walltime_s": max(1, int(limit)), "memory_mb": int(opts.get("mem", "1024M").rstrip("M"))}))
    subprocess.Popen([sys.executable, "-m", "corral.lanes.local_runner", str(d)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(jid)


def _state(r: dict[str, object]) -> tuple[str, str]:
    """-> (Slurm state, ExitCode) of a job."""
    res = r["result"]
    if not isinstance(res, dict):
        return ("RUNNING" if r["running"] else "PENDING"), "0:0"
    st, code = str(res["state"]), res.get("exit_code")
    if st == "CANCELLED":
        return "CANCELLED by 0", "0:15"
    if st == "TIMEOUT":
        return "TIMEOUT", "0:15"
    if st == "OUT_OF_MEMORY":
        return "OUT_OF_MEMORY", "0:125"
    if isinstance(code, int) and code > 128:
        return "FAILED", f"0:{code - 128}"
    return ("COMPLETED" if st == "COMPLETED" else "FAILED"), f"{code or 0}:0"


def _select(args: list[str], ids_flag: str, name_flag: str) -> list[dict[str, object]]:
    ids = set(args[args.index(ids_flag) + 1].split(",")) if ids_flag in args else None
    name = args[args.index(name_flag) + 1] if name_flag in args else None
    return [r for r in map(record, jobs()) if (ids is None or str(r["id"]) in ids) and (name is None or r["name"] == name)]


_LONG = {"JobID": "i", "State": "T", "Reason": "r", "StartTime": "S", "Comment": "k", "RestartCnt": "R", "NodeList": "N"}
"""squeue -O's field names -> the -o letters (RestartCnt has none: the fake never requeues)."""


def squeue(args: list[str]) -> None:
    if "-O" in args:  # 'JobID:|,State:|,...': each field, then its suffix
        fmt = "".join(f"%{_LONG[name]}{suffix}" for name, _, suffix in
                      (f.partition(":") for f in args[args.index("-O") + 1].split(",")))
    else:
        fmt = args[args.index("-o") + 1]
    for r in _select(args, "-j", "-n"):
        st, _ = _state(r)
        if st not in ("PENDING", "RUNNING"):
            continue
        running = r["running"]
        start = running.get("start_time") if isinstance(running, dict) else None
        fields = {"i": str(r["id"]), "T": st, "r": "None", "S": stamp(start) if start else "N/A", "k": str(r["comment"]),
                  "R": "0", "N": "localhost" if st == "RUNNING" else ""}
        print(re.sub(r"%([a-zA-Z])", lambda m: fields.get(m.group(1), ""), fmt))  # noqa: B023 (used at once)


def sacct(args: list[str]) -> None:
    cols = args[args.index("-o") + 1].split(",")
    for r in _select(args, "-j", "--name"):
        st, code = _state(r)
        res = r["result"] if isinstance(r["result"], dict) else {}
        running = r["running"] if isinstance(r["running"], dict) else {}
        values = {"JobID": str(r["id"]), "State": st, "ExitCode": code, "JobName": str(r["name"]),
                  "Start": stamp(res.get("start_time") or running.get("start_time")),
                  "End": stamp(res.get("end_time")), "Reason": "None", "Comment": str(r["comment"])}
        print("|".join(values.get(c, "") for c in cols))


def scancel(args: list[str]) -> None:
    for jid in args:
        d = STATE / "jobs" / jid
        if not d.is_dir() or (d / "result.json").exists():
            continue
        (d / "cancel").touch()  # the supervisor checks it; SIGTERM makes it act now
        if (d / "running.json").exists():
            try:
                os.kill(int(json.loads((d / "running.json").read_text())["pid"]), signal.SIGTERM)
            except (OSError, ValueError, KeyError):
                pass


def scontrol(args: list[str]) -> None:
    c = conf()
    if args[:2] == ["show", "node"]:
        for n in c["nodes"]:
            print(f"NodeName={n['NodeName']} CPUTot={n.get('CPUs', 1)} RealMemory={n.get('RealMemory', 1024)} "
                  f"Gres={n.get('Gres', '(null)')} AvailableFeatures=(null) State=IDLE")
    elif args[:2] == ["show", "partition"]:
        for p in c["parts"]:
            print(f"PartitionName={p['PartitionName']} Nodes={p.get('Nodes', 'ALL')} Default={p.get('Default', 'NO')} "
                  f"MaxTime={p.get('MaxTime', 'UNLIMITED')} State=UP")


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]  # the shim on PATH passes its own name first
    if cmd == "sinfo":
        print("\n".join(f"{p['PartitionName']} up" for p in conf()["parts"]))
        return
    {"sbatch": sbatch, "squeue": squeue, "sacct": sacct, "scancel": scancel, "scontrol": scontrol}[cmd](args)


if __name__ == "__main__":
    main()
