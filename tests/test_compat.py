"""corral's Slurm shims against Slurm's own commands, invocation by invocation: the
corpus (tests/compat/corpus.tsv, 278 invocations agents use) was run against the
private Slurm by scripts/record-slurm-golden (tests/golden/slurm_compat.json); here it
runs as an agent would: an agent's token, inside ``corral agent run`` (fenced by
bubblewrap where it is installed: /usr/bin/sbatch is the shim), against a gateway in
front of the same Slurm. Outputs, errors and exit codes are compared after normalising
ids, dates and blanks; durations and memory are compared as printed, except a running
job's elapsed time (runner.ELAPSED); `scontrol show job` field by field over the
fields the shim prints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from corral.core.workdirs import NOT_WRITABLE

from .compat import runner
from .conftest import Gateway, free_port, slurm_lock
from .slurm_env import layout, slurm_conf

FIELD_BY_FIELD = {"scontrol_show_job"}
KNOWN = {("scontrol_show_job", "TRES"): "a job that names no memory gets corral's default (1 GB), not the "
                                        "partition's DefMemPerCPU (documented in README)",
         ("scontrol_show_job", "MinMemoryNode"): "the same: corral's default is per node, Slurm's DefMemPerCPU per CPU"}
REFUSED = {name: NOT_WRITABLE for name in ("i50_out_unwritable_dir", "i50_out_err_unwritable")}
"""Where corral refuses what Slurm takes, before anything runs and in words that say why
(the invocation prints rc=1 where Slurm's printed rc=0): -o/-e into a directory the
agent made but its jobs' identity (a dynamic uid) may not write; Slurm's job, run as the
submitter, writes there (issue 50 item 16)."""
ELAPSED_FIELDS = {"RunTime"}
"""scontrol's fields that say how long the job has run so far."""
"""Differences corral means, each named: nothing else may differ."""


def nodes_reach(conf: str) -> str:
    """This host's address as the private Slurm's nodes reach it: its bridge on the cluster
    (scripts/slurm-up), this host itself on the one-node layout."""
    return f"{layout(conf)['NET']}.254" if layout(conf)["LAYOUT"] == "cluster" else "127.0.0.1"


def _ids_from(db: Path, first: int) -> None:
    """corral's job ids from ``first`` on, as a facility's are (a small id would read like
    a count of CPUs to the normaliser)."""
    import sqlite3

    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM sqlite_sequence WHERE name = 'jobs'")
        conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('jobs', ?)", (first,))
    conn.close()


def run_corpus(conf: str, only: list[str] | None = None) -> dict:
    """The corpus run as an agent, through the shims and a gateway of its own: {ids, results}
    (``only``: those invocations). The nodes reach the gateway on their bridge, as Slurm's
    commands inside the corpus's jobs do (decision 0057)."""
    root = Path(tempfile.mkdtemp(prefix="corral-compat-"))
    root.chmod(0o755)
    # The corpus's jobs take a turn on the real Slurm (conftest.slurm_lock) while the corpus
    # runs, shared: the tests that fill the node run alone. (Beside one of those, Slurm
    # preempted the corpus's running sleeper, an agent's opportunistic job: decision 0022.)
    with slurm_lock(shared=True):
        # The corpus runs a few invocations at a time (tests/compat/runner.py), faster than
        # an agent's API rate allows: what is compared is each output, not the pace.
        port = free_port()
        gw = Gateway(root / "home", port, extra_env={
            "CORRAL_BACKEND": "slurm", "SLURM_CONF": conf, "CORRAL_TICK_S": "0.5", "CORRAL_RATE_API_PER_S": "0",
            "CORRAL_HOST": "0.0.0.0", "CORRAL_INSECURE": "true",
            "CORRAL_SLURM__GATEWAY_ADDRESS": f"{nodes_reach(conf)}:{port}"})
        gw.home.mkdir()
        gw.start()
        _ids_from(gw.home / "corral.db", 700_000)
        try:
            with gw.http() as h:
                assert h.post("/v1/principals", json={"name": "compat-agent", "kind": "agent",
                                                      "sponsor": "admin"}).status_code == 201
                token = h.post("/v1/tokens", json={"for": "compat-agent", "expires": "2h"}).json()["token"]
            env = runner.base_env()
            env.update({"SLURM_CONF": conf, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                        "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"})
            work = root / "work"
            work.mkdir()
            work.chmod(0o777)  # the agent's jobs run contained, as an unprivileged user under a root gateway
            out = root / "results.json"
            r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--url", gw.url, "--token",
                                token, "--quiet", "--", sys.executable, "-m", "tests.compat.runner", str(out),
                                *([",".join(only)] if only else [])],
                               cwd=work, env=env, capture_output=True, text=True, timeout=1800)
            assert r.returncode == 0 and out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
            return dict(json.loads(out.read_text()))
        finally:
            gw.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def shim_results(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[dict, dict]:
    """The corpus's results, run once per test session: the first pytest-xdist worker to get
    here runs it; the other reads what it wrote (before, each worker ran the whole corpus)."""
    import fcntl

    conf = slurm_conf()
    base = tmp_path_factory.getbasetemp()
    shared = (base if worker_id == "master" else base.parent) / "compat-results.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            shared.write_text(json.dumps(run_corpus(conf)))
        got = json.loads(shared.read_text())
    return got["ids"], got["results"]


GOLDEN = json.loads(runner.GOLDEN.read_text())


@pytest.mark.parametrize("name", [n for n, _ in runner.corpus()])
def test_invocation_matches_slurm(shim_results, name: str) -> None:
    ids, results = shim_results
    want, got = GOLDEN["results"][name], results[name]
    assert got["cmd"] == want["cmd"], "the corpus changed: run scripts/record-slurm-golden"
    real_ids, ours = want.get("ids", GOLDEN["ids"]), ids  # a result recorded again carries its own
    assert got["rc"] == want["rc"], f"exit code {got['rc']}, Slurm's {want['rc']}: {got['stderr']}"
    if name in REFUSED:
        assert want["stdout"] == "rc=0\n" and got["stdout"] == "rc=1\n", got
        assert REFUSED[name] in got["stderr"] and got["stderr"].startswith("sbatch: error: output file "), got
        return
    if name in FIELD_BY_FIELD:
        mine = runner.fields(runner.normalize(got["stdout"], ours))
        theirs = runner.fields(runner.normalize(want["stdout"], real_ids))
        assert mine, got["stderr"]
        differ = {k: (v, theirs.get(k)) for k, v in mine.items()
                  if theirs.get(k) != v and (name, k) not in KNOWN and k not in ELAPSED_FIELDS}
        assert not differ, f"fields differ (shim, Slurm): {differ}"
        return
    elapsed = name in runner.ELAPSED
    assert runner.normalize(got["stdout"], ours, elapsed) == runner.normalize(want["stdout"], real_ids, elapsed)
    assert runner.normalize(got["stderr"], ours, elapsed) == runner.normalize(want["stderr"], real_ids, elapsed)
