"""The backend contract on a real Slurm (scripts/slurm-up), plus what only Slurm does:
the generated script, the state table, preflight against real limits, provenance."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from corral.lanes.backend import SubmitContext
from corral.lanes.slurm.backend import STATES, SlurmBackend, parse_exit, parse_slurm_time, translate
from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec, JobState

from .backend_contract import *  # noqa: F401,F403
from .backend_contract import check_free_counts_what_runs, ctx, wait_all
from .conftest import SHARED_TURN
from .slurm_env import slurm_conf

# Real-Slurm tests take turns (tests/conftest.py::slurm_turn): these share theirs, except
# the ones marked to run alone (they fill the node, or count its free CPUs).
pytestmark = [pytest.mark.usefixtures("slurm_turn"), SHARED_TURN]

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def conf() -> str:
    return slurm_conf()


@pytest.fixture
def backend(conf, tmp_path):
    return SlurmBackend(tmp_path / "slurm-jobs", conf)


def sacct(conf: str, job: str, fields: str) -> str:
    env = {**os.environ, "SLURM_CONF": conf}
    return subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", fields], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


# -- no Slurm needed ---------------------------------------------------------------------

@pytest.mark.slurm_turn("none")  # asks Slurm nothing
def test_generated_script_matches_golden(tmp_path) -> None:
    b = SlurmBackend(tmp_path / "jobs", None, 100, "agents")  # no sandbox: the script as written (contained: test_gateway_slurm.py)
    spec = JobSpec(command="python train.py --epochs 3", cpus=4, memory="8G", gpus=2, walltime="90s",
                   partition="gpu", env={"SEED": "42", "MSG": "it's ok"}, workdir="/work/alice")
    c = SubmitContext(17, "claude-1", "agent", "alice", "sess-9", None, "physics")
    script = b.render(c, spec, Path("/jobs/17"))
    assert script == (GOLDEN / "slurm_agent_job.sh").read_text()
    human = b.render(SubmitContext(18, "alice", "human"), JobSpec(script="#!/bin/bash\necho hi\n"), Path("/jobs/18"))
    assert human == (GOLDEN / "slurm_human_script.sh").read_text()


@pytest.mark.slurm_turn("none")  # asks Slurm nothing
def test_state_table_and_exit_codes() -> None:
    assert translate("CANCELLED by 0") is JobState.CANCELLED
    assert translate("OUT_OF_MEMORY") is JobState.OUT_OF_MEMORY
    assert translate("COMPLETING") is JobState.RUNNING
    assert translate("NEW_STATE_FROM_THE_FUTURE") is JobState.UNKNOWN
    assert all(isinstance(v, JobState) for v in STATES.values())
    assert parse_exit("3:0") == (3, 0) and parse_exit("0:9") == (137, 9) and parse_exit("x") == (None, 0)
    assert parse_slurm_time("1:00:00") == 3600 and parse_slurm_time("2-00:00:00") == 172800
    assert parse_slurm_time("30") == 1800 and parse_slurm_time("UNLIMITED") is None


@pytest.mark.slurm_turn("none")  # asks Slurm nothing
def test_preflight_suggests_the_partition_that_fits(tmp_path) -> None:
    """A facility where only 'gpu' has GPUs and only 'long' runs for days (no Slurm needed)."""
    from corral.lanes.backend import Partition

    b = SlurmBackend(tmp_path / "jobs", None, partitions=[
        Partition("cpu", 64, 256000, 0, 3600, default=True), Partition("gpu", 32, 512000, 8, 86400),
        Partition("long", 64, 256000, 0, 7 * 86400)])
    with pytest.raises(InvalidRequest, match="use partition 'gpu', or set gpus to 0"):
        b.preflight(JobSpec(command="true", gpus=2))
    with pytest.raises(InvalidRequest, match="or use partition 'long'"):  # no GPUs: not sent to the GPU nodes
        b.preflight(JobSpec(command="true", walltime="5h"))
    b.preflight(JobSpec(command="true", gpus=2, partition="gpu"))  # fits: no error


# -- a real Slurm ------------------------------------------------------------------------

def test_partitions_from_the_cluster(backend) -> None:
    parts = {p.name: p for p in backend.partitions()}
    assert set(parts) >= {"debug", "batch", "gpu"}
    assert parts["debug"].default and parts["debug"].max_walltime_s == 3600
    assert parts["gpu"].max_gpus == 4 and parts["batch"].max_cpus == 32


def test_preflight_names_the_nearest_valid_request(backend, tmp_path) -> None:
    cases = {
        "this facility has: debug, batch, gpu": JobSpec(command="true", partition="gpuz"),
        "ask for memory <= 64000M": JobSpec(command="true", memory="100G"),
        "ask for gpus <= 4": JobSpec(command="true", partition="gpu", gpus=8),
        "or use partition 'batch'": JobSpec(command="true", walltime="3h"),
        "ask for cpus <= 32": JobSpec(command="true", cpus=64),
    }
    for words, spec in cases.items():
        asked = dict(backend.controller_calls)
        with pytest.raises(InvalidRequest) as e:
            backend.submit(ctx(), spec)
        assert words in e.value.message and "''s" not in e.value.message, e.value.message
        # refused from the cached limits: no sbatch reached the controller (counted, not timed)
        assert backend.controller_calls.get("sbatch", 0) == asked.get("sbatch", 0), backend.controller_calls


def test_provenance_is_in_slurm_accounting(backend, conf, tmp_path) -> None:
    c = SubmitContext(next(iter([int(time.time()) % 100000 + 500000])), "claude-7", "agent", "alice", "sess-42")
    bid = backend.submit(c, JobSpec(command="echo hi", workdir=str(tmp_path), name="sweep-3.train"))
    wait_all(backend, [bid])
    deadline = time.time() + 60
    while time.time() < deadline:  # slurmdbd may record the job (its name) before its comment
        row = sacct(conf, bid, "JobName,Comment")
        if row.startswith("corral-") and f"corral_job={c.job_id}" in row:
            break
        time.sleep(0.5)
    name, comment = row.split("|", 1)
    assert name == f"corral-{c.job_id}-sweep-3.train"  # corral's id and the user's name
    for part in (f"corral_job={c.job_id}", "principal=claude-7", "kind=agent", "sponsor=alice", "session=sess-42"):
        assert part in comment
    env = {**os.environ, "SLURM_CONF": conf}
    nice = subprocess.run(["scontrol", "show", "job", bid], env=env, capture_output=True, text=True).stdout
    assert "Nice=100" in nice or nice == ""  # purged from slurmctld after MinJobAge is also fine


def test_gpu_job_gets_its_devices(backend, tmp_path) -> None:
    bid = backend.submit(ctx(), JobSpec(command="echo $CUDA_VISIBLE_DEVICES", partition="gpu", gpus=2,
                                        workdir=str(tmp_path)))
    assert wait_all(backend, [bid])[bid].state is JobState.COMPLETED
    assert backend.output_paths(bid).stdout.read_text().strip() == "0,1"


def test_resubmit_after_crash_finds_the_job(backend, tmp_path) -> None:
    c = ctx()
    spec = JobSpec(command="echo once", workdir=str(tmp_path))
    first = backend.submit(c, spec)
    (backend.jobs_dir / str(c.job_id) / "backend_id").unlink()  # the crash: id never recorded
    again = SlurmBackend(backend.jobs_dir, backend.slurm_conf).submit(c, spec)
    assert again == first


def test_runs_as_the_principals_unix_user(conf) -> None:
    """A principal with a unix_user is submitted with sbatch --uid/--gid (the gateway is root)."""
    import pwd
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("submitting as another user needs a root gateway")
    user = "corral-alice"
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", user], check=True)
    root = Path(tempfile.mkdtemp(prefix="corral-uid-"))  # not pytest's 0700 tmp: the user must reach it
    root.chmod(0o755)
    b = SlurmBackend(root / "jobs", conf)
    c = SubmitContext(int(time.time()) % 100000 + 800000, "alice", "human", unix_user=user)
    bid = b.submit(c, JobSpec(command="id -un; touch mine"))
    st = wait_all(b, [bid])[bid]
    assert st.state is JobState.COMPLETED, b.output_paths(bid).stderr.read_text()
    assert b.output_paths(bid).stdout.read_text() == f"{user}\n"
    # no directory named: it starts in its own out/ (corral's directory above it is root's)
    assert (root / "jobs" / str(c.job_id) / "out" / "mine").stat().st_uid == pwd.getpwnam(user).pw_uid
    deadline = time.time() + 30
    while time.time() < deadline and sacct(conf, bid, "User") != user:
        time.sleep(0.5)
    assert sacct(conf, bid, "User") == user
    with pytest.raises(InvalidRequest, match="does not exist"):
        b.submit(SubmitContext(c.job_id + 1, "bob", "human", unix_user="no-such-user-here"), JobSpec(command="true"))


@pytest.mark.slurm_turn("none")  # asks Slurm nothing
def test_accounting_lag_is_asked_again_next_tick(tmp_path) -> None:
    """squeue says a job ended but sacct has no record yet: the next status call polls
    again instead of waiting poll_s (no Slurm needed: the one door is replaced)."""
    calls: list[str] = []
    answers = {"squeue": "42|CANCELLED|None|2026-01-01T00:00:00\n", "sacct": ""}

    def fake_run(*argv: str) -> str:
        calls.append(argv[0])
        return answers[argv[0]]

    b = SlurmBackend(tmp_path / "jobs", None, poll_s=3600, run=fake_run)
    first = b.status(["42"])["42"]
    assert first.state is JobState.RUNNING and "waiting for accounting" in (first.reason or "")
    answers["sacct"] = "42|CANCELLED by 0|0:15|2026-01-01T00:00:00|2026-01-01T00:00:05|None\n"
    assert b.status(["42"])["42"].state is JobState.CANCELLED
    assert calls == ["squeue", "sacct", "squeue", "sacct"]


@pytest.mark.slurm_turn("alone")  # counts the node's free CPUs
def test_free_counts_what_runs_now(backend, tmp_path) -> None:
    check_free_counts_what_runs(backend, tmp_path, "gpu")  # c1 alone on the private cluster (decision 0032)
