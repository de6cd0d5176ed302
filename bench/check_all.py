"""Every benchmark's quick run, one after another, as CI runs them (`make bench-check`).

Each ``bench/NAME.py --quick`` must exit 0 (a run whose arm measured nothing exits 3,
see ``_common.finish``), print one JSON object as its last line of output, and finish
within the quick budget. The budget is 30 s (issue 46); the check allows 40 s so that a
CI machine's noise does not fail a run that met the budget at home, and prints every
time so a creeping one is seen. A table of names, times and outcomes is printed, then
one JSON object.

    python bench/check_all.py [NAME ...]
"""

from __future__ import annotations

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
    rows = []
    for path in benches(sys.argv[1:]):
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
