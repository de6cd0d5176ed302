"""The audit chain over a real gateway: decisions are recorded, refusals too, and any
edit, drop, insertion, reordering or cut of the log is found and located."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from .conftest import Gateway


def _verify(gw: Gateway) -> tuple[int, str]:
    cp = gw.cli("audit", "verify", "--home", str(gw.home))
    return cp.returncode, cp.stdout + cp.stderr


def test_decisions_are_chained_and_tampering_is_located(gateway: Gateway, people: dict[str, str], tmp_path: Path) -> None:
    with gateway.http(people["bot1"], session="s-a") as h:
        ok = h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}).json()
        assert h.post("/v1/jobs", json={"command": "true", "cpus": 999}).status_code == 400
        h.post("/v1/jobs/batch", json={"jobs": [{"command": "true", "workdir": str(tmp_path)}] * 3})
        h.post("/v1/jobs/cancel", json={"ids": [ok["id"]]})
    with gateway.http(people["carol"]) as h:
        assert h.post("/v1/jobs/cancel", json={"ids": [ok["id"]]}).status_code == 404  # not hers: refused
    code, out = _verify(gateway)
    # 8 from the fixture (4 principals added, 4 tokens minted), then 7 here
    assert code == 0 and "15 records" in out, out
    found = [json.loads(line) for line in gateway.cli("audit", "search", "--home", str(gateway.home),
                                                      "--decision", "deny").stdout.splitlines()]
    assert [(r["principal"], r["action"], r["rule"]) for r in found] == [("bot1", "submit", "invalid_request"),
                                                                          ("carol", "cancel", "not_found")]
    mine = gateway.cli("audit", "search", "--home", str(gateway.home), "--job", str(ok["id"])).stdout.splitlines()
    assert [json.loads(r)["action"] for r in mine] == ["submit", "cancel"]
    assert json.loads(mine[0])["session"] == "s-a" and json.loads(mine[0])["sponsor"] == "alice"
    assert len(gateway.cli("audit", "tail", "--home", str(gateway.home), "-n", "2").stdout.splitlines()) == 2

    log = gateway.home / "audit.jsonl"
    pristine = log.read_text().splitlines(keepends=True)

    def tampered(lines: list[str]) -> str:
        log.write_text("".join(lines))
        code, out = _verify(gateway)
        log.write_text("".join(pristine))
        assert code == 1, out
        return out

    edited = list(pristine)
    assert '"decision":"allow"' in edited[2]
    edited[2] = edited[2].replace('"decision":"allow"', '"decision":"deny"')
    assert "line 3 (record 3): record 3 was edited" in tampered(edited)
    log.write_text("".join(edited))  # --json says the same, as data, with the same exit code
    cp = gateway.cli("--json", "audit", "verify", "--home", str(gateway.home))
    log.write_text("".join(pristine))
    said = json.loads(cp.stdout)
    assert cp.returncode == 1 and not said["ok"] and said["problems"][0]["line"] == 3, cp.stdout
    assert "record 3 was edited" in said["problems"][0]["what"]
    said = json.loads(gateway.cli("--json", "audit", "verify", "--home", str(gateway.home)).stdout)
    assert said == {"ok": True, "records": 15, "head": 15, "problems": []}, said
    assert "records 2..2 were dropped" in tampered(pristine[:1] + pristine[2:])
    assert "out of order" in tampered(pristine[:1] + [pristine[2], pristine[1]] + pristine[3:])
    assert "out of order or inserted" in tampered(pristine[:2] + [pristine[0]] + pristine[2:])
    assert "cut off the end" in tampered(pristine[:-2])
    assert _verify(gateway)[0] == 0


def test_the_chain_survives_a_restart(gateway: Gateway, tmp_path: Path) -> None:
    with gateway.http() as h:
        h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)})
    gateway.kill(signal.SIGKILL)
    gateway.start()
    with gateway.http() as h:
        h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)})
    code, out = _verify(gateway)
    assert code == 0 and "2 records" in out, out
    assert oct(Path(gateway.home / "audit.key").stat().st_mode & 0o777) == "0o600"


def test_segments_rotate_and_the_chain_runs_across_them(tmp_path: Path) -> None:
    from .conftest import running

    with running(tmp_path, CORRAL_AUDIT_SEGMENT_MB="0.0005") as gw:  # ~500 B: a segment every 2 records
        with gw.http() as h:
            for _ in range(6):
                assert h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}).status_code == 201
        segments = sorted(gw.home.glob("audit-*.jsonl"))
        assert len(segments) >= 2, segments
        code, out = _verify(gw)
        assert code == 0 and "6 records" in out, out
        # a segment's name is its first record, and the next segment starts where it ends
        firsts = [int(p.name[6:18]) for p in segments]
        assert firsts[0] == 1 and firsts == sorted(firsts)
        found = gw.cli("audit", "search", "--home", str(gw.home), "--action", "submit").stdout.splitlines()
        assert len(found) == 6  # search reads every segment, not only the live file
        cp = gw.cli("analyze", str(gw.home / "audit.jsonl"), "--json")
        assert cp.returncode == 0 and json.loads(cp.stdout)["source"]["jobs"] == 6, cp.stdout + cp.stderr
        gw.kill(signal.SIGKILL)  # start-up finds the head in the newest file and chains on from it
        gw.start()
        with gw.http() as h:
            assert h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}).status_code == 201
        code, out = _verify(gw)
        assert code == 0 and "7 records" in out, out

        segments = sorted(gw.home.glob("audit-*.jsonl"))
        middle = segments[1]
        saved = middle.read_bytes()
        middle.unlink()
        code, out = _verify(gw)
        assert code == 1 and "were dropped" in out and "a segment before" in out, out
        middle.write_bytes(saved.replace(b'"decision":"allow"', b'"decision":"deny"', 1))
        code, out = _verify(gw)
        assert code == 1 and f"{middle.name}, line 1" in out and "was edited" in out, out
        middle.write_bytes(saved)
        first = segments[0]
        saved_first = first.read_bytes()
        first.unlink()  # the oldest segment removed: records 1.. are missing, which verify says
        code, out = _verify(gw)
        assert code == 1 and "records 1.." in out, out
        first.write_bytes(saved_first)
        assert _verify(gw)[0] == 0


def test_the_one_writer_keeps_its_file_open_but_never_writes_to_one_moved_away(tmp_path: Path) -> None:
    """A SQLite gateway is its audit chain's one writer (its home's lock): it keeps the live
    file open between appends instead of opening and locking it each time (bench/policy.py).
    An admin's logrotate that moves the file away must not take the next records with it."""
    from corral.safety.audit import AuditLog

    live, moved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.1"

    def open_to(path: Path) -> list[str]:  # this process's descriptors on ``path``
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                    out.append(fd)
            except OSError:
                pass
        return out

    log = AuditLog(live, tmp_path / "audit.key", shared=False)
    log.append([{"what": "first"}])
    kept = open_to(live)
    log.append([{"what": "second"}])
    assert len(kept) == 1 and open_to(live) == kept  # the same descriptor, not opened again
    live.rename(moved)
    log.append([{"what": "third"}])
    assert '"what":"third"' in live.read_text() and '"what":"third"' not in moved.read_text()
    assert open_to(moved) == [] and len(open_to(live)) == 1  # the moved file let go
    log.close()
    assert open_to(live) == []
