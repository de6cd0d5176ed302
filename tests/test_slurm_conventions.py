"""Slurm's conventions, exactly (issue 34): one parser of Slurm's formats
(corral/core/slurm_formats.py) used by the shims, the CLI and the API; the shims print what
the job asked; squeue of a purged job fails as Slurm's; the job sees Slurm's
environment; real Slurm flags corral does not serve are refused by name.

The shim tests run as an agent (its own token, through ``corral agent run``) against a
real gateway on the local backend; what each asserts was checked on the private Slurm
22.05 first (noted beside it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral.core import slurm_formats as sf
from corral.core.jobs import JobSpec, parse_duration_s

from .conftest import SHARED_TURN, Gateway
from .test_gateway_slurm import slurm_gateway  # noqa: F401  (the fixture)
from .test_shims import agent_run


def agent_token(gw: Gateway) -> str:
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "admin"}).status_code == 201
        return str(h.post("/v1/tokens", json={"for": "bot", "expires": "1h"}).json()["token"])


@pytest.mark.parametrize("text,secs", [
    ("5", 300), ("1:30", 120), ("90:00", 5400), ("1:00:00", 3600), ("1-12", 129600), ("1-0:30", 88200),
    ("2-3:4:5", 183900), ("0", sf.NO_LIMIT), ("UNLIMITED", sf.NO_LIMIT), ("infinite", sf.NO_LIMIT),
    ("-1", sf.NO_LIMIT)])
def test_time_in_every_form_sbatch_accepts(text: str, secs: int) -> None:
    # squeue %l on the private Slurm: -t 1-12 -> 1-12:00:00, 1:30 -> 2:00, 2-3:4:5 -> 2-03:05:00, 0 -> UNLIMITED
    assert sf.time_seconds(text) == secs


@pytest.mark.parametrize("text", ["abc", "1-", "1:2:3:4", "5m", ""])
def test_a_time_slurm_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        sf.time_seconds(text)


def test_memory_and_shape_as_slurm_computes_them() -> None:
    assert [sf.memory_mb(x) for x in ("500", "2G", "1000K", "1T", "4GB", "0")] == [500, 2048, 1, 1 << 20, 4096, 0]
    with pytest.raises(ValueError):
        sf.memory_mb("lots")
    # squeue %m / TRES on the private Slurm: 1500M, 1.50G, 3G, 62.50G, 1T
    assert [sf.memory_text(x) for x in (1500, 1536, 3072, 64000, 1 << 20)] == ["1500M", "1.50G", "3G", "62.50G",
                                                                               "1T"]
    assert sf.shape("4", None, "1").cpus == 4 and sf.shape(None, "2", None, "3").cpus == 6
    with pytest.raises(ValueError, match='Invalid numeric value "0" for --ntasks'):
        sf.shape("0")


def test_min_job_age_is_read_from_slurm_conf(tmp_path: Path) -> None:
    from corral.lanes.slurm.vocab import min_job_age_s

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nMinJobAge=45\n")
    assert min_job_age_s(str(conf)) == 45
    conf.write_text("ClusterName=x\n")
    assert min_job_age_s(str(conf)) == 300 and min_job_age_s(None) == 300


def test_the_api_reads_slurms_colon_forms_as_slurm_and_wants_a_unit_on_bare_digits() -> None:
    assert parse_duration_s("1-12") == 36 * 3600  # was 1 day 12 seconds
    assert parse_duration_s("1-12:00") == 36 * 3600  # was 1 day 12 minutes
    assert parse_duration_s("30m") == 1800 and parse_duration_s(90) == 90
    with pytest.raises(ValueError, match="no unit"):
        JobSpec(command="true", walltime="5")
    assert parse_duration_s("600", "expiry") == 600  # elsewhere digits stay seconds


def test_corral_submit_time_is_minutes_as_for_slurm(gateway: Gateway, tmp_path: Path) -> None:
    def submit(*args: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "--json", "submit", *args, "--", "true"],
                           env=gateway.env(), capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    assert submit("--time", "5")["spec"]["walltime"] == 300
    assert submit("-t", "1:30:00")["spec"]["walltime"] == 5400
    assert submit("-t", "90s")["spec"]["walltime"] == 90
    with gateway.http() as h:
        r = h.post("/v1/jobs", json={"command": "true", "walltime": "5"})
        assert r.status_code in (400, 422) and "no unit" in r.text


def _lines(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """KEY=VALUE lines an agent's script printed."""
    return dict(x.split("=", 1) for x in r.stdout.splitlines() if "=" in x and x.split("=", 1)[0].isupper())


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_the_shims_print_what_the_job_asked(slurm_gateway: Gateway, agent_dir: Path) -> None:  # noqa: F811
    # pending behind a sleeper (written when the shim held a job after submitting it, which a
    # job as short as `true` could outrun; -H is one held submission now, decision 0013)
    script = (
        "S=$(sbatch --parsable -o /dev/null -t 5 --wrap 'sleep 120'); "
        "A=$(sbatch --parsable -d afterok:$S -t 5 --mem=2G --wrap true); "
        "B=$(sbatch --parsable -d afterok:$S -t 0 --mem-per-cpu=200 -n2 -J 'my job' --wrap true); "
        "C=$(sbatch --parsable -d afterok:$S -p batch -t 1-12 -N1 -n4 --wrap true); "
        "echo \"A=$(squeue -h -j $A -o '%l %m %C')\"; echo \"B=$(squeue -h -j $B -o '%l %m %C %j')\"; "
        "echo \"C=$(squeue -h -j $C -o '%l %C')\"; "
        "echo \"BSHOW=$(scontrol show job $B -o)\"; "
        "echo \"ACCT=$(sacct -X -n -P -j $A -o ReqMem,Timelimit)\"; "
        "echo \"LONG=$(squeue -l -h -j $C)\"; "
        # the private Slurm: a pending job cancelled is gone from squeue -n NAME at once
        "Q=$(sbatch --parsable -J 'gone q' -d afterok:$S -o /dev/null --wrap true); scancel $Q; "
        "echo \"QN=$(squeue -h -n 'gone q' | wc -l)\"; scancel $A $B $C $S")
    r = agent_run(slurm_gateway, agent_token(slurm_gateway), script, agent_dir, "--no-fence")
    got = _lines(r)
    assert got.get("A") == "5:00 2G 1", r.stdout + r.stderr
    with slurm_gateway.http() as h:  # the cluster's MinJobAge (scripts/slurm-up: 300), for squeue -j's lifecycle
        assert {p.get("min_job_age_s") for p in h.get("/v1/facility").json()["partitions"]} == {300}
    assert got["B"] == "UNLIMITED 200M 2 my job"
    assert got["C"] == "1-12:00:00 4"  # (squeue -l keeps 1-12:00:00 whole in its 9-wide column, as Slurm's)
    show = dict(x.split("=", 1) for x in got["BSHOW"].split() if "=" in x)
    assert show["TimeLimit"] == "UNLIMITED" and show["NumTasks"] == "2" and show["MinMemoryCPU"] == "200M"
    assert show["TRES"].startswith("cpu=2,mem=400M,node=1") and show["StdOut"].endswith("slurm-" + show["JobId"]
                                                                                           + ".out")
    assert got["ACCT"] == "2G|00:05:00"
    assert "1-12:00:00" in got["LONG"]
    assert got["QN"] == "0"


def test_srun_runs_its_tasks_and_keeps_stderr_apart(gateway: Gateway, people: dict[str, str],
                                                    agent_dir: Path) -> None:
    script = ("srun -N1 -n2 echo hi; srun -n3 true; echo RC3=$?; srun -l -n2 sh -c 'echo x'; srun sh -c 'echo out; echo err >&2' 2>/dev/null; "
              "srun -u true; echo rc=$?")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    out = r.stdout.splitlines()
    assert out[:3] == ["hi", "hi", "RC3=1"], r.stdout + r.stderr  # 3 tasks on 2 CPUs: refused, saying so
    assert "3 CPUs asked but the largest node has 2" in r.stderr
    assert sorted(out[3:5]) == ["0: x", "1: x"] and out[5] == "out" and out[6] == "rc=0"


def test_a_job_sees_slurms_environment(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    sub = agent_dir / "sub"
    sub.mkdir(mode=0o777)
    sub.chmod(0o777)
    script = ("cd sub; ID=$(sbatch --parsable -W -o env.out --wrap 'echo JOB=$SLURM_JOB_ID; echo JOBID=$SLURM_JOBID; "
              "echo SUBMIT=$SLURM_SUBMIT_DIR; echo USR=$USER; echo NT=$SLURM_NTASKS' -n2); echo ID=$ID; "
              "cat env.out; "
              "AID=$(sbatch --parsable -W -a 3-4 -o arr-%a.out --wrap 'echo AJ=$SLURM_ARRAY_JOB_ID AT=$SLURM_ARRAY_TASK_ID "
              "AC=$SLURM_ARRAY_TASK_COUNT'); echo AID=$AID; cat arr-3.out; "
              "M=$(sbatch --parsable -W -o nodir/x.out --wrap 'echo should-not-run'); echo MRC=$?; "
              "echo MISS=$(sacct -X -n -P -j $M -o State,ExitCode)")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence", )
    got = _lines(r)
    assert got.get("JOB") == got["ID"] == got["JOBID"], r.stdout + r.stderr
    assert got["SUBMIT"] == str(sub) and got["USR"] and got["NT"] == "2"
    assert r.stdout.count("AJ=" + got["AID"] + " AT=3 AC=2") == 1
    # the private Slurm: sbatch -o nodir/x.out -> FAILED 0:53 (sbatch -W exits 0:53's code, 0... checked below)
    assert got["MISS"] == "FAILED|0:53"
    assert "should-not-run" not in r.stdout


def test_real_flags_are_refused_by_name_and_other_commands_name_corral(gateway: Gateway, people: dict[str, str],
                                                                        agent_dir: Path) -> None:
    script = ("sbatch --ntasks-per-core=1 --wrap true; echo rc=$?; squeue --start; echo rc=$?; "
              "sbatch --nice=5 --wrap true; echo rc=$?; srun --kill-on-bad-exit true; echo rc=$?; "
              "sbatch --bogus-flag --wrap true; echo rc=$?; "
              "for c in salloc sstat sprio sshare sacctmgr; do $c; echo rc=$?; done; "
              "ID=$(sbatch --parsable -W -o /dev/null --ntasks-per-node=2 --gpus-per-node=0 --wrap true); "
              "echo NPN=$(sacct -X -n -P -j $ID -o AllocCPUS)")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    assert r.stdout.split()[:10] == ["rc=1", "rc=1", "rc=1", "rc=1", "rc=255"] + ["rc=1"] * 5, r.stdout + r.stderr
    for says in ("corral's sbatch does not support --ntasks-per-core yet", "corral's squeue does not support "
                 "--start yet", "corral's sbatch does not support --nice", "corral's srun does not support "
                 "--kill-on-bad-exit yet", "sbatch: unrecognized option '--bogus-flag'"):
        assert says in r.stderr
    for cmd in ("salloc", "sstat", "sprio", "sshare", "sacctmgr"):
        line = next(x for x in r.stderr.splitlines() if x.startswith(cmd + ":"))
        assert "corral" in line and "Permission denied" not in line
    assert "NPN=2" in r.stdout


def test_squeue_of_a_job_gone_from_the_controller_fails_so_the_loop_ends(gateway: Gateway, people: dict[str, str],
                                                                         agent_dir: Path) -> None:
    # the private Slurm: squeue -h -j PURGED -> 'slurm_load_jobs error: Invalid job id specified', exit 1
    script = ("export CORRAL_MIN_JOB_AGE_S=1; ID=$(sbatch --parsable -o /dev/null --wrap true); n=0; "
              "while squeue -h -j $ID >/dev/null 2>&1 && [ $n -lt 60 ]; do sleep 0.5; n=$((n+1)); done; "
              "squeue -h -j $ID; echo rc=$?; squeue -h -j $ID,999999; echo RC2=$?; "
              "echo ACCT=$(sacct -X -n -P -j $ID -o State)")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    got = _lines(r)
    assert "slurm_load_jobs error: Invalid job id specified" in r.stderr, r.stdout + r.stderr
    assert r.stdout.count("rc=1") == 1 and got["RC2"] == "0" and got["ACCT"] == "COMPLETED"


def test_a_held_submission_is_never_sent_before_its_release(gateway: Gateway, people: dict[str, str],
                                                            agent_dir: Path) -> None:
    # The private Slurm: sbatch -H -> PENDING JobHeldUser until scontrol release (silent, exit 0);
    # scontrol release of a finished job: 'Job has already finished for job ID', exit 1.
    r = agent_run(gateway, people["bot1"], "ID=$(sbatch --parsable -H -o held.out --wrap 'echo ran'); echo ID=$ID; "
                  "sleep 1; echo ST=$(squeue -h -j $ID -o '%T|%r')", agent_dir, "--no-fence")
    got = _lines(r)
    assert got.get("ST") == "PENDING|JobHeldUser", r.stdout + r.stderr
    with gateway.http() as h:  # recorded held: never sent to its lane, so it could not start first
        assert h.get(f"/v1/jobs/{got['ID']}").json()["backend_id"] is None
    assert not (agent_dir / "held.out").exists()
    r = agent_run(gateway, people["bot1"], f"scontrol release {got['ID']}; echo rc=$?; "
                  f"for i in $(seq 200); do s=$(sacct -X -n -P -j {got['ID']} -o State); "
                  "case $s in COMPLETED|FAILED|CANCELLED*) break;; esac; sleep 0.3; done; echo $s; cat held.out; "
                  f"scontrol release {got['ID']}; echo rc=$?", agent_dir, "--no-fence")
    assert r.stdout.split() == ["rc=0", "COMPLETED", "ran", "rc=1"], r.stdout + r.stderr
    assert f"Job has already finished for job {got['ID']}" in r.stderr


def test_srun_passes_its_stdin_to_every_task(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    # The private Slurm: printf 'a\nb\n' | srun -n2 cat -> a b a b; srun cat </dev/null -> nothing, exit 0
    script = ("printf 'a\\nb\\n' | srun -n2 cat | sort | tr '\\n' ' '; echo; echo hi | srun wc -c; "
              "srun cat </dev/null; echo rc=$?; head -c 3000 /dev/zero | tr '\\0' x > big; srun wc -c < big; "
              # stdin a pipe its writer holds open (a process substitution, which the script
              # need not wait for, unlike a pipeline's first command): srun returns while it is
              "exec 3< <(exec sleep 30 2>/dev/null); W=$!; srun echo not-waiting <&3; "
              "kill -0 $W && echo its-stdin-still-open; kill $W")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    assert r.stdout.splitlines() == ["a a b b ", "3", "rc=0", "3000", "not-waiting", "its-stdin-still-open"], \
        r.stdout + r.stderr
