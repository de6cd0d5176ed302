"""What guarding a job's output costs the gateway per megabyte, by the shape of its
lines, side by side with the pattern that joined wrapped tokens before (quadratic in a
run of token characters), in one run.

    python bench/output_guard.py [--quick]

Each output is one file a job could write: a training log (short lines), a blob on one
line (base64), a line of one letter (a progress bar without line ends), JSON lines of a
few kilobytes. Each is guarded whole through ``OutputGuard`` as an agent's reads would
(``read`` until the end, at most 1 MiB of raw output a read), once with corral's
patterns as they are and once with ``secrets._WRAPPED`` set back to the pattern before
(three runs of each arm, the median kept; one with --quick). CPU is the process's own
(``time.process_time``): the gateway holds the GIL through a regular expression, so a
read's CPU is how long every other caller of that gateway waits. The old pattern on the
one-line outputs is measured on their first 20 KB and 40 KB only (10 and 20 KB with
--quick), its growth said and a megabyte estimated from it (quadratic): whole megabytes
would take hours.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402
from corral.safety import secrets  # noqa: E402
from corral.safety.output_guard import OutputGuard  # noqa: E402

BEFORE = re.compile(r"([A-Za-z0-9_+/=-]{4,})(\r?\n)([A-Za-z0-9_+/=-]{4,})")
"""secrets._WRAPPED before (commit 5169dec and earlier)."""
NOW = secrets._WRAPPED


def outputs(mb: float) -> dict[str, str]:
    n = int(mb * 1_000_000)
    log = "".join(f"epoch {i // 100} step {i} loss {1 / (i + 1):.5f} lr 3e-4 grad_norm 0.91\n" for i in range(n // 60))
    blob = base64.b64encode(os.urandom(n * 3 // 4)).decode() + "\n"
    jsonl = "".join(json.dumps({"step": i, "metrics": {f"m{k}": k * 0.5 for k in range(300)}}) + "\n"
                    for i in range(max(1, n // 4000)))
    return {"training_log": log, "base64_blob_one_line": blob, "json_lines_4kb": jsonl, "one_letter_one_line": "a" * n + "\n"}


def guard_cpu(text: str, pattern: re.Pattern[str]) -> float:
    """CPU seconds to guard ``text`` to its end, as a finished job's output read page by page."""
    secrets._WRAPPED = pattern
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "stdout"
        raw.write_text(text)
        g = OutputGuard(Path(d) / "guarded")
        t = time.process_time()
        for _ in range(10_000):
            if g.read("1.stdout", raw, True, 0, 4096, 4096).page["eof"]:
                break
        return time.process_time() - t


def median(f: Callable[[], float], runs: int) -> float:
    return statistics.median(f() for _ in range(runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="1 MB outputs (else 4 MB), one run of each arm, the old pattern on 10 and 20 KB (else 20 and 40)")
    a = ap.parse_args()
    # The old pattern's cost grows with the square of a line: the quick run's halved
    # prefixes cost a quarter (its 20 and 40 KB took 85 of the quick run's 90 CPU-s).
    mb, runs, head = (1.0, 1, 10_000) if a.quick else (4.0, 3, 20_000)
    out: dict[str, object] = {"bench": "output_guard", "mb": mb}
    took: dict[str, bool] = {}  # CPU measured in each arm on each output (a zero is a clock that did not see it)
    print(f"{'output':24} {'now s/MB':>10} {'before s/MB':>12}")
    for name, text in outputs(mb).items():
        size = len(text) / 1e6
        if name.endswith("_one_line"):  # the old pattern on a whole megabyte: hours
            now = median(partial(guard_cpu, text, NOW), runs) / size
            small = {k: median(partial(guard_cpu, text[:k] + "\n", BEFORE), runs) for k in (head, 2 * head)}
            growth = small[2 * head] / small[head] if small[head] else float("nan")
            took[f"{name} now"], took[f"{name} before"] = now > 0, small[head] > 0 and small[2 * head] > 0
            kb = head // 1000
            out[name] = {"now_s_per_mb": round(now, 4), f"before_s_{kb}kb": round(small[head], 3),
                         f"before_s_{2 * kb}kb": round(small[2 * head], 3), "before_growth_x2": round(growth, 2),
                         "before_s_per_mb_estimated": round(small[head] * (1e6 / head) ** 2, 0)}
            print(f"{name:24} {now:10.4f} {f'{kb} KB {small[head]:.2f} s, {2 * kb} KB {small[2 * head]:.2f} s':>12}")
            continue
        now = median(partial(guard_cpu, text, NOW), runs) / size
        before = median(partial(guard_cpu, text, BEFORE), runs) / size
        out[name] = {"now_s_per_mb": round(now, 4), "before_s_per_mb": round(before, 4)}
        took[f"{name} now"], took[f"{name} before"] = now > 0, before > 0
        print(f"{name:24} {now:10.4f} {before:12.4f}")
    secrets._WRAPPED = NOW
    finish("output_guard", out, took)


if __name__ == "__main__":
    main()
