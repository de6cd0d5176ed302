"""The fast lane's launcher on its own (no engine, no gateway): slots, outputs, exit
codes, walltime, memory, cancellation, GPUs and the journal, with real processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from corral.lanes.fast.launcher import Launcher, Slots, read_journals


def spec(d: Path, jid: int, command: str, **kw: Any) -> dict[str, Any]:
    return {"job_id": jid, "command": command, "cpus": 1, "memory_mb": 100, "gpus": 0, "walltime_s": 60,
            "env": {"PATH": "/usr/bin:/bin"}, "dir": str(d), "workdir": None, **kw}


def by_id(results: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["job_id"]: r for r in results}


def test_outputs_exit_codes_and_journal(tmp_path) -> None:
    la = Launcher(Slots(4, 1000))
    (tmp_path / "wd").mkdir()
    out = by_id(la.run_batch([
        spec(tmp_path, 1, "echo out-$CORRAL_JOB_ID; echo err >&2"),
        spec(tmp_path, 2, "exit 3"),
        spec(tmp_path, 3, "pwd", workdir=str(tmp_path / "wd")),
        spec(tmp_path, 4, "true"),
        spec(tmp_path, 5, "/no/such/program"),
        spec(tmp_path / "gone", 6, "true"),
    ]))
    assert (tmp_path / "1.out").read_text() == "out-1\n" and (tmp_path / "1.err").read_text() == "err\n"
    assert out[1]["state"] == "COMPLETED" and out[1]["exit_code"] == 0
    assert out[2]["state"] == "FAILED" and out[2]["exit_code"] == 3 and out[2]["reason"] == "exit code 3"
    assert (tmp_path / "3.out").read_text().strip() == str(tmp_path / "wd")
    assert out[4]["state"] == "COMPLETED" and out[4]["cpu_s"] >= 0
    assert out[5]["state"] == "FAILED" and out[5]["exit_code"] == 127  # as a shell reports it
    assert out[6]["state"] == "FAILED" and "could not start" in out[6]["reason"]
    assert str(tmp_path / "gone") in out[6]["reason"]
    journal = read_journals(tmp_path)
    assert {j: r["state"] for j, r in journal.items()} == {j: r["state"] for j, r in out.items() if j != 6}


def test_tasks_wait_for_free_slots(tmp_path) -> None:
    la = Launcher(Slots(2, 1000))
    out = by_id(la.run_batch([spec(tmp_path, j, "sleep 0.3") for j in range(1, 5)]))
    spans = sorted((r["start"], r["end"]) for r in out.values())
    assert all(r["state"] == "COMPLETED" for r in out.values())
    # two slots: never more than two at once, so the third starts after the first ended
    for t, _ in spans:
        assert sum(1 for s, e in spans if s <= t < e) <= 2
    assert spans[2][0] >= spans[0][1] - 0.01


def test_a_task_larger_than_what_is_free_waits_without_blocking_smaller_ones(tmp_path) -> None:
    la = Launcher(Slots(2, 1000))
    results: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: results.extend(la.run_batch([spec(tmp_path, 1, "sleep 0.5")])))
    first.start()
    time.sleep(0.1)
    out = by_id(la.run_batch([spec(tmp_path, 2, "true", cpus=2), spec(tmp_path, 3, "true")]))
    first.join()
    assert out[3]["end"] < results[0]["end"] <= out[2]["start"] + 0.01


def test_walltime_memory_and_cancel_are_enforced(tmp_path) -> None:
    la = Launcher(Slots(4, 4000))
    hog = "python3 -c 'x = bytearray(300 * 2**20); import time; time.sleep(30)'"
    threading.Timer(0.5, la.cancel, args=([3, 4],)).start()
    t = time.monotonic()
    out = by_id(la.run_batch([spec(tmp_path, 1, "sleep 30", walltime_s=1),
                              spec(tmp_path, 2, hog, memory_mb=50),
                              spec(tmp_path, 3, "sleep 30"),
                              spec(tmp_path, 4, "sleep 30", cpus=8)]))  # never fits: cancelled while waiting
    assert time.monotonic() - t < 10
    assert out[1]["state"] == "TIMEOUT" and "walltime of 1 s" in out[1]["reason"]
    assert out[2]["state"] == "OUT_OF_MEMORY" and "50 MB" in out[2]["reason"]
    assert out[3]["state"] == "CANCELLED" and out[4]["state"] == "CANCELLED"
    la.cancel([5])
    assert la.run_batch([spec(tmp_path, 5, "true")])[0]["state"] == "CANCELLED"  # cancelled before it arrived


def test_each_gpu_goes_to_one_task_at_a_time(tmp_path) -> None:
    la = Launcher(Slots(4, 1000, ["0", "1"]))
    out = by_id(la.run_batch([spec(tmp_path, j, "echo $CUDA_VISIBLE_DEVICES; sleep 0.2", gpus=1) for j in range(1, 5)]))
    seen = {j: (tmp_path / f"{j}.out").read_text().strip() for j in out}
    assert set(seen.values()) == {"0", "1"}
    for a in out.values():  # two tasks holding the same GPU never overlap
        for b in out.values():
            if a is not b and seen[a["job_id"]] == seen[b["job_id"]]:
                assert a["end"] <= b["start"] + 0.01 or b["end"] <= a["start"] + 0.01
