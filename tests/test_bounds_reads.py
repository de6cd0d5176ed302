"""What the gateway reads of files a job or an agent can influence (H4 report, F11;
corral/core/safe_read.py): a FIFO, a device or a link where corral expects a plain file, and
`inputs` naming what the job may not read. Each attack as the reviewer ran it, against a
real root gateway over HTTP: the gateway answers everyone throughout, and reads nothing
the job could not read itself."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import SHARED_TURN, Gateway, running, temporary_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="reads as the job's identity are a root gateway's (CI runs as root)")


def tokens(gw: Gateway, *agents: tuple[str, str], unix: dict[str, str] | None = None) -> dict[str, str]:
    """Humans (with ``unix``'s Unix users) and the agents they sponsor -> name: token."""
    with gw.http() as h:
        for name in sorted({s for _, s in agents}):
            body = {"name": name, "kind": "human", **({"unix_user": unix[name]} if unix and name in unix else {})}
            assert h.post("/v1/principals", json=body).status_code == 201
        for name, sponsor in agents:
            assert h.post("/v1/principals", json={"name": name, "kind": "agent", "sponsor": sponsor}).status_code == 201
        return {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n, _ in agents}


@pytest.fixture
def canary() -> Iterator[Path]:
    """root's own 0600 file in a directory anyone may enter, and a world-writable place."""
    d = Path(tempfile.mkdtemp(prefix="corral-reads-", dir="/tmp"))
    d.chmod(0o777)
    secret = d / "root-only.txt"
    secret.write_text("CANARY-ROOT-ONLY-31c9\n")
    secret.chmod(0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _healthy(gw: Gateway) -> bool:
    try:
        return httpx.get(f"{gw.url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_cache_inputs_never_block_and_are_no_oracle(tmp_path: Path, canary: Path) -> None:
    """F11 (d): `inputs: ["/dev/zero"]` with cache kept the gateway at 88% CPU for ever;
    a FIFO blocked a worker thread for ever; a root-only file was hashed (its existence
    and its contents' identity told to an agent whose job cannot read it)."""
    fifo = canary / "pipe"
    os.mkfifo(fifo, 0o666)
    (canary / "link").symlink_to(canary / "root-only.txt")
    mine = canary / "data.csv"
    mine.write_text("a,b\n1,2\n")
    mine.chmod(0o644)
    with running(tmp_path) as gw:
        t = tokens(gw, ("bot1", "alice"))
        answers: dict[str, tuple[int, str]] = {}
        with gw.http(t["bot1"]) as h:
            h.timeout = httpx.Timeout(30)
            assert gw.proc is not None
            for name in ("/dev/zero", str(fifo), str(canary / "root-only.txt"), str(canary / "link"),
                         str(canary / "missing.txt"), "/dev/stdin", f"/proc/{gw.proc.pid}/environ", "/proc/self/status"):
                r = h.post("/v1/jobs", json={"command": "true", "cache": True, "inputs": [name], "walltime": "60s"})
                answers[name] = (r.status_code, r.json()["error"]["message"].replace(name, "PATH")
                                 if r.status_code >= 400 else r.text)
                plan = h.post("/v1/plan", json={"command": "true", "cache": True, "inputs": [name]}).json()
                assert plan["allowed"] is False, (name, plan)
                assert plan["refused"]["message"].replace(name, "PATH") == answers[name][1], (name, plan)
            assert _healthy(gw)
            # One answer for every refusal: missing, root's, a link to root's, a FIFO, a device.
            assert {code for code, _ in answers.values()} == {400}, answers
            assert len({msg for _, msg in answers.values()}) == 1, answers
            assert "CANARY" not in str(answers)
            # What the job may read is hashed, and the cache answers the same job again.
            body = {"command": "cat data.csv", "workdir": str(canary), "cache": True, "inputs": [str(mine)],
                    "walltime": "60s"}
            r = h.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            assert h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
            again = h.post("/v1/plan", json=body).json()
            assert again["cache"] == {"hit": True, "job_id": r.json()["id"], "state": "COMPLETED"}, again
            mine.write_text("a,b\n1,3\n")  # a changed input is a new key
            assert h.post("/v1/plan", json=body).json()["cache"]["hit"] is False


def test_inputs_are_bounded_in_count_and_size(tmp_path: Path, canary: Path) -> None:
    """A sparse file of 2 GiB (no disk spent) passes the size bound: refused at once,
    not hashed for seconds; over 256 inputs is refused by the schema."""
    big = canary / "sparse.bin"
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    big.chmod(0o644)
    with running(tmp_path) as gw:
        t = tokens(gw, ("bot1", "alice"))
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "true", "cache": True, "inputs": [str(big)], "walltime": "60s"})
            assert r.status_code == 400 and "MiB" in r.json()["error"]["message"], r.text
            many = [f"/tmp/x{i}" for i in range(257)]
            r = h.post("/v1/jobs", json={"command": "true", "cache": True, "inputs": many, "walltime": "60s"})
            assert r.status_code in (400, 422), r.text


def test_inputs_the_sandbox_hides_are_refused_like_missing_ones(tmp_path: Path, canary: Path) -> None:
    """A file the job's identity may read but its sandbox empties ([sandbox] hide, the
    credentials under a home): its cache key would tell the agent it exists and when it
    changes. Refused, with the answer a missing file gets, by name or through a link."""
    import json

    hidden = canary / "hidden"
    hidden.mkdir()
    hidden.chmod(0o755)
    (hidden / "creds").write_text("CANARY-HIDDEN\n")
    (hidden / "creds").chmod(0o644)
    (canary / "to-creds").symlink_to(hidden / "creds")
    with running(tmp_path, CORRAL_SANDBOX__HIDE=json.dumps([str(hidden)])) as gw:
        t = tokens(gw, ("bot1", "alice"))
        with gw.http(t["bot1"]) as h:
            said = set()
            for name in (str(hidden / "creds"), str(canary / "to-creds"), str(hidden / "none")):
                r = h.post("/v1/jobs", json={"command": "true", "cache": True, "inputs": [name], "walltime": "60s"})
                assert r.status_code == 400, r.text
                said.add(r.json()["error"]["message"].replace(name, "PATH"))
            assert len(said) == 1, said


# -- a Unix user's job directory on Slurm: the job's own user may put anything there ---------


@pytest.fixture
def unix_user() -> Iterator[pwd.struct_passwd]:
    with temporary_user("corralr") as u:
        yield u


def _swap(path: Path, to: str, owner: pwd.struct_passwd) -> None:
    """What the job's user does in its own job directory: ``to`` is 'fifo', 'hard:<file>'
    (a hard link, as where fs.protected_hardlinks is off) or a symlink's target."""
    path.unlink(missing_ok=True)
    if to == "fifo":
        os.mkfifo(path, 0o644)
    elif to.startswith("hard:"):
        os.link(to[5:], path)
        return
    else:
        path.symlink_to(to)
    os.lchown(path, owner.pw_uid, owner.pw_gid)


def _file(jobs: Path, job_id: int, name: str) -> Path:
    """Where the job's own user writes ``name``: its job directory, or the ``out/`` in it
    that is all the user owns where corral keeps its own record apart."""
    d = jobs / str(job_id)
    return d / "out" / name if (d / "out").is_dir() else d / name


def _until(what: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("not reached in time")


@SHARED_TURN
def test_fifos_and_links_in_a_job_directory_never_stall_the_gateway(
        tmp_path: Path, canary: Path, unix_user: pwd.struct_passwd, slurm_turn: None) -> None:
    """F11 (a)-(c): a Unix user's Slurm job swaps `started`, `stderr` and `stdout` for
    FIFOs (or links to root's files) in its own job directory. On main the reconciler,
    the event loop and then every worker thread hung on the FIFOs."""
    from .slurm_env import slurm_conf

    work = Path(tempfile.mkdtemp(prefix="corral-work-", dir="/tmp"))
    os.chown(work, unix_user.pw_uid, unix_user.pw_gid)
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=slurm_conf(), CORRAL_TICK_S="0.5") as gw:
        t = tokens(gw, ("cbot", "dana"), ("other", "erin"), unix={"dana": unix_user.pw_name})
        jobs = gw.home / "slurm" / "jobs"
        with gw.http(t["cbot"]) as h:
            # (c)+(b): started and stderr become FIFOs while the job runs; it then fails.
            a = h.post("/v1/jobs", json={"command": "echo hello; echo oops >&2; sleep 4; exit 3",
                                         "workdir": str(work), "walltime": "60s"}).json()["id"]
            _until(lambda: (_file(jobs, a, "started")).exists())
            _swap(_file(jobs, a, "started"), "fifo", unix_user)
            _swap(_file(jobs, a, "stderr"), "fifo", unix_user)
            # A job whose output is a link to root's file, not read before the swap.
            c = h.post("/v1/jobs", json={"command": "echo mine", "workdir": str(work),
                                         "walltime": "60s"}).json()["id"]
            _until(lambda: (_file(jobs, c, "ended")).exists())
            _swap(_file(jobs, c, "stdout"), str(canary / "root-only.txt"), unix_user)
            _swap(_file(jobs, c, "stderr"), "hard:" + str(canary / "root-only.txt"), unix_user)
            _swap(_file(jobs, c, "started"), "/dev/zero", unix_user)
        with gw.http(t["other"]) as h:  # another agent's job still moves through its states
            b = h.post("/v1/jobs", json={"command": "echo B", "walltime": "60s"}).json()["id"]
            assert h.get(f"/v1/jobs/{b}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
        assert _healthy(gw)
        with gw.http(t["cbot"]) as h:
            h.timeout = httpx.Timeout(20)
            done = h.get(f"/v1/jobs/{a}/wait", params={"timeout": 60}).json()
            assert done["state"] in ("FAILED", "COMPLETED") and done.get("exit_code") in (3, None), done
            assert _healthy(gw)
            # (a): stdout a FIFO after the end; ten reads at once, then everyone is still served.
            _swap(_file(jobs, a, "stdout"), "fifo", unix_user)
            codes: list[int] = []

            def read() -> None:
                try:
                    with gw.http(t["cbot"]) as h2:
                        h2.timeout = httpx.Timeout(20)
                        codes.append(h2.get(f"/v1/jobs/{a}/output").status_code)
                except httpx.HTTPError:
                    codes.append(0)

            threads = [threading.Thread(target=read) for _ in range(10)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            assert codes == [200] * 10, codes
            assert _healthy(gw)
            err = h.get(f"/v1/jobs/{a}/output", params={"stream": "stderr"})
            assert err.status_code == 200, err.text
            out = h.get(f"/v1/jobs/{c}/output")
            assert out.status_code == 200 and "CANARY" not in out.text, out.text
            err = h.get(f"/v1/jobs/{c}/output", params={"stream": "stderr"})
            assert err.status_code == 200 and "CANARY" not in err.text, err.text[:200]
        with gw.http(t["other"]) as h:
            b2 = h.post("/v1/jobs", json={"command": "echo B2", "walltime": "60s"}).json()["id"]
            assert h.get(f"/v1/jobs/{b2}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
    shutil.rmtree(work, ignore_errors=True)
