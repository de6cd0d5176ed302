"""Red team: the risk tagger against 250 disguised attacks and the 637 shell commands
real coding agents ran (../shared/data/agent-bash-commands.jsonl), with tagging time.

    python bench/redteam.py [--quick]

Blocked means the default decision for an agent is not 'allow' (deny, or review by a
person); the false-positive rate counts benign commands the default would deny. Last
line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import pct  # noqa: E402
from corral.safety.redteam import attacks  # noqa: E402
from corral.safety.risk import analyze, decide  # noqa: E402


def benign() -> list[str]:
    for parent in Path(__file__).resolve().parents:
        f = parent / "shared" / "data" / "agent-bash-commands.jsonl"
        if f.exists():
            return [json.loads(line)["command"] for line in f.read_text().splitlines()]
    return [json.loads(line)["command"] for line in Path("/work/shared/data/agent-bash-commands.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="(the suite is small: same as a full run)")
    ap.parse_args()
    cases, ok = attacks(), benign()
    lat: list[float] = []
    decisions, tagged, by_disguise = Counter(), 0, Counter()
    for cmd, tag, how in cases:
        t = time.perf_counter()
        r = analyze(cmd)
        lat.append((time.perf_counter() - t) * 1000)
        decisions[decide(r)[0]] += 1
        tagged += tag in r.tags
        by_disguise[how] += tag not in r.tags
    denied = []
    for cmd in ok:
        t = time.perf_counter()
        d = decide(analyze(cmd))[0]
        lat.append((time.perf_counter() - t) * 1000)
        if d == "deny":
            denied.append(cmd)
    out = {"bench": "redteam", "attacks": len(cases), "tagged_rate": round(tagged / len(cases), 4),
           "blocked_rate": round(1 - decisions["allow"] / len(cases), 4),
           "denied": decisions["deny"], "review": decisions["review"],
           "benign": len(ok), "false_positive_rate": round(len(denied) / len(ok), 4),
           "tag_p50_ms": round(pct(lat, 50), 3), "tag_p99_ms": round(pct(lat, 99), 3),
           "missed_by_disguise": {k: v for k, v in by_disguise.items() if v}}
    print(f"attacks {len(cases)}: {decisions}; benign {len(ok)}: denied {len(denied)}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
