"""Every benchmark's quick run, one after another, as CI runs them (`make bench-check`).

Each ``bench/NAME.py --quick`` must exit 0 (a run whose arm measured nothing exits 3,
see ``_common.finish``), print one JSON object as its last line of output, and finish
within the quick budget. The budget is 30 s (issue 46); the check allows 40 s so that a
CI machine's noise does not fail a run that met the budget at home, and prints every
time so a creeping one is seen. A table of names, times and outcomes is printed, then
one JSON object.

    python bench/check_all.py [NAME ...]
    python bench/check_all.py --full [NAME ...]   # full runs, each recorded in bench/records/NAME.json
    python bench/check_all.py --table [--write]   # docs/benchmarks.md's "When measured" table, from those

A full run's record names its command, the commit it measured (with "+dirty" when the tree
had uncommitted changes), the date and its JSON: docs/benchmarks.md's table is made from the
records, and tests/test_benchmarks_doc.py holds the two to each other and to the benches.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET_S = 30.0
LIMIT_S = 40.0


def benches(names: list[str]) -> list[Path]:
    found = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != "check_all.py")
    if names:
        found = [p for p in found if p.stem in names]
    return found


def last_json(out: str) -> dict | None:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


RESULTS = HERE / "records"
FULL_LIMIT_S = 3600.0  # memory embeds 100,000 notes: 39 min under load


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE.parent).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "corral", "bench")
    return git("rev-parse", "--short=12", "HEAD") + ("+dirty" if dirty else "")


def record(path: Path) -> dict:
    """One full run, recorded with its command, commit and date."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=FULL_LIMIT_S,
                          cwd=HERE.parent)
    took = time.monotonic() - start
    result = last_json(proc.stdout)
    row = {"bench": path.stem, "command": f"python bench/{path.name}", "commit": commit(),
           "date": datetime.date.today().isoformat(), "seconds": round(took, 1), "exit": proc.returncode,
           "result": result}
    if proc.returncode != 0 or result is None:
        sys.stderr.write(f"--- bench/{path.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}\n")
    else:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{path.stem}.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


def table() -> str:
    """The "When measured" table: one row per bench, from its record (or saying there is none)."""
    lines = ["| bench | command | commit | date | full run | measured nothing |", "|---|---|---|---|---|---|"]
    for path in benches([]):
        f = RESULTS / f"{path.stem}.json"
        if not f.exists():
            lines.append(f"| {path.stem} | `python bench/{path.name}` | not re-measured at this stop: its section's "
                         "figures are older | | | |")
            continue
        r = json.loads(f.read_text())
        empty = ", ".join((r.get("result") or {}).get("measured_nothing") or []) or "none"
        lines.append(f"| {r['bench']} | `{r['command']}` | {r['commit']} | {r['date']} | {r['seconds']:.0f} s | {empty} |")
    return "\n".join(lines)


def run(path: Path) -> dict:
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(path), "--quick"], capture_output=True, text=True,
                              timeout=LIMIT_S * 3, cwd=HERE.parent)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -1, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timed out"
    took = time.monotonic() - start
    result = last_json(out)
    problems = []
    if rc != 0:
        problems.append(f"exit {rc}")
    if result is None:
        problems.append("no JSON object last")
    if took > LIMIT_S:
        problems.append(f"{took:.0f} s over the {BUDGET_S:.0f} s quick budget")
    if problems:
        sys.stderr.write(f"--- bench/{path.name} --quick: {'; '.join(problems)}\n{err[-3000:]}\n")
    return {"bench": path.stem, "seconds": round(took, 1), "ok": not problems, "problems": problems}


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--table"]:
        if args[1:] == ["--write"]:  # into docs/benchmarks.md, between its markers
            doc = HERE.parent / "docs" / "benchmarks.md"
            text = doc.read_text()
            a, b = "<!-- measured:begin -->\n", "\n<!-- measured:end -->"
            start, end = text.index(a) + len(a), text.index(b)
            doc.write_text(text[:start] + table() + text[end:])
        print(table())
        return 0
    if args[:1] == ["--full"]:
        rows = [record(p) for p in benches(args[1:])]
        for r in rows:
            print(f"{r['bench']:<18} {r['seconds']:7.1f} s  exit {r['exit']}", flush=True)
        return 1 if any(r["exit"] != 0 or r["result"] is None for r in rows) else 0
    rows = []
    for path in benches(args):
        row = run(path)
        rows.append(row)
        print(f"{row['bench']:<18} {row['seconds']:6.1f} s  {'ok' if row['ok'] else 'FAILED: ' + '; '.join(row['problems'])}",
              flush=True)
    failed = [r["bench"] for r in rows if not r["ok"]]
    total = sum(r["seconds"] for r in rows)
    print(json.dumps({"benches": len(rows), "failed": failed, "total_s": round(total, 1),
                      "slowest": max(rows, key=lambda r: r["seconds"])["bench"] if rows else None}))
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
