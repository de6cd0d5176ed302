"""docs/benchmarks.md says when (issue 46 item 3): its "When measured" table is the one
`python bench/check_all.py --table` makes from the benches' recorded full runs, every
benchmark has one, each names a commit of this history, and none measured nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import check_all  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"


def shown() -> str:
    m = re.search(r"<!-- measured:begin -->\n(.*?)\n<!-- measured:end -->", DOC.read_text(), re.S)
    assert m, "docs/benchmarks.md has no 'When measured' table between its markers"
    return m.group(1).strip()


def test_the_doc_shows_the_recorded_runs_as_they_are() -> None:
    assert shown() == check_all.table(), "run `python bench/check_all.py --table` and paste it into docs/benchmarks.md"


def test_every_benchmark_has_a_quick_mode_and_a_row() -> None:
    """A bench without a recorded full run is still in the table, saying its figures are
    older than its record would be (the table never leaves one out)."""
    names = [p.stem for p in check_all.benches([])]
    assert len(names) >= 29, names
    for path in check_all.benches([]):
        assert "--quick" in path.read_text(), f"bench/{path.name} has no --quick mode"
    rows = [line.split("|")[1].strip() for line in shown().splitlines()[2:]]
    assert rows == names


def test_each_record_names_a_commit_of_this_history_and_measured_something() -> None:
    for f in sorted(check_all.RESULTS.glob("*.json")):
        r = json.loads(f.read_text())
        assert r["bench"] == f.stem and r["command"] == f"python bench/{f.stem}.py", f
        sha = r["commit"].removesuffix("+dirty")
        assert subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=ROOT).returncode == 0, (f, sha)
        assert r["exit"] == 0 and isinstance(r["result"], dict), f
        assert not r["result"].get("measured_nothing"), (f, r["result"]["measured_nothing"])
