"""Agents at the login node: corral's Slurm command shims and ``corral agent run``.

On the local backend: an agent's own shell loop (sbatch, a squeue -j poll, cat of the
output file, sacct) served by the gateway. On the private Slurm, under bubblewrap: the
fence (no munge socket, Slurm's own binaries replaced) and the agent's jobs still
reaching Slurm, through corral."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SHARED_TURN, Gateway, free_port
from .test_gateway_slurm import slurm_gateway  # noqa: F401  (the fixture)

LOOP = ('ID=$(sbatch --parsable -J probe --wrap "echo hello from \\$SLURM_JOB_NAME"); '
        'while squeue -h -j "$ID" | grep -q .; do sleep 0.3; done; '
        'cat "slurm-$ID.out"; sacct -j "$ID" -X -P -n -o JobName,State,ExitCode')


def agent_run(gw: Gateway, token: str, script: str, cwd: Path, *flags: str,
              extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**gw.env(token), **(extra or {})}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--url", gw.url, *flags, "--",
                           "bash", "-c", script], env=env, capture_output=True, text=True, timeout=180, cwd=cwd)


def test_an_agents_shell_loop_is_served_by_corral(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    r = agent_run(gateway, people["bot1"], LOOP + "; echo PATH0=$(command -v sbatch)", agent_dir, "--no-fence")
    assert r.returncode == 0, r.stderr
    assert "hello from probe" in r.stdout and "probe|COMPLETED|0:0" in r.stdout
    assert "corral-agent-" in r.stdout.split("PATH0=")[1]  # the shim, first on PATH
    assert "agent session" in r.stderr
    with gateway.http(people["bot1"]) as h:  # the job is the agent's, in its session
        jobs = h.get("/v1/jobs").json()["jobs"]
        assert [j["name"] for j in jobs] == ["probe"] and jobs[0]["session"].startswith("agent-")


def test_a_job_script_submitted_by_file_is_named_by_its_file(gateway: Gateway, people: dict[str, str],
                                                              agent_dir: Path) -> None:
    """issue 49: `sbatch job.sh` recorded JobName 'wrap'; Slurm names it 'job.sh' (decision
    0045 fixed the name; this is its test): in sacct and the job's own record."""
    script = ("printf '#!/bin/bash\\necho hi\\n' > job.sh; ID=$(sbatch --parsable job.sh); "
              "while squeue -h -j $ID | grep -q .; do sleep 0.3; done; "
              "sacct -X -n -P -j $ID -o JobName")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence", "--quiet")
    assert r.returncode == 0 and r.stdout.split() == ["job.sh"], r.stdout + r.stderr
    with gateway.http(people["bot1"]) as h:
        assert [j["name"] for j in h.get("/v1/jobs").json()["jobs"]] == ["job.sh"]


def test_what_a_shim_cannot_honour_is_an_error_naming_the_flag(gateway: Gateway, people: dict[str, str],
                                                               agent_dir: Path) -> None:
    script = ("sbatch -A other --wrap true; echo rc=$?; sbatch --nodes=4 --wrap true; echo rc=$?; "
              "squeue --bogus; echo rc=$?; squeue -o '%Y'; echo rc=$?; sacct -o MaxRSS; echo rc=$?; "
              "scancel; echo rc=$?; sacct -S yesterday-ish; echo rc=$?; squeue -o %p; echo rc=$?; "
              "sbatch --time=abc --wrap true; echo rc=$?")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    assert r.stdout.split() == ["rc=1"] * 8 + ["rc=255"], r.stdout + r.stderr  # sbatch's own code for a bad --time
    for says in ("does not support --account", "does not support --nodes=4", "unrecognized option '--bogus'",
                 "does not support the format field %Y", "does not support the field MaxRSS",
                 "No job identification provided", "Invalid time specification (pos=0): yesterday-ish",
                 "does not support the format field %p", "Invalid --time specification"):
        assert says in r.stderr
    assert "Traceback" not in r.stderr
    # issue 49: no corral command or tool takes an account; the refusal says what corral does instead
    assert "MCP tool" not in r.stderr and "charges every job to your principal's account" in r.stderr, r.stderr


def test_a_shim_without_a_gateway_says_so_in_slurms_words(agent_dir: Path) -> None:
    env = {**os.environ, "CORRAL_URL": f"http://127.0.0.1:{free_port()}", "CORRAL_TOKEN": "x"}
    r = subprocess.run([sys.executable, "-m", "corral.edges.shims", "squeue"], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "Unable to contact slurm controller" in r.stderr and "Traceback" not in r.stderr


def test_agent_run_refuses_what_it_cannot_start(gateway: Gateway, agent_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--", "no-such-agent-program"],
                       env=gateway.env("tok"), capture_output=True, text=True, cwd=agent_dir)
    assert r.returncode == 2 and "not a program on PATH" in r.stderr
    r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--", "true"],
                       env={k: v for k, v in gateway.env().items() if k != "CORRAL_TOKEN"}, capture_output=True,
                       text=True, cwd=agent_dir)
    assert r.returncode == 2 and "no token" in r.stderr
    # `--token $TOKEN` with TOKEN empty: --token '' quoted, or --token -- unquoted; a token
    # the gateway does not know. None starts the agent.
    for flags in (["--token", ""], ["--token"], ["--token", "crb_not-a-token"]):
        r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", *flags, "--", "echo", "STARTED"],
                           env=gateway.env(), capture_output=True, text=True, cwd=agent_dir)
        assert r.returncode == 2 and "STARTED" not in r.stdout and "error:" in r.stderr, (flags, r.stdout, r.stderr)


def test_claude_and_codex_get_corrals_mcp_server_by_their_own_mechanisms(tmp_path: Path) -> None:
    from corral.edges.cli.agent_run import client_args

    cfg = tmp_path / "mcp.json"
    env = {"CORRAL_URL": "http://gw:1", "CORRAL_TOKEN": "t", "CORRAL_SESSION": "s"}
    # one word: `--mcp-config FILE` would take the prompt after it as another file
    assert client_args(["claude", "hi"], cfg, "/x/corral", env) == ["claude", f"--mcp-config={cfg}", "hi"]
    codex = client_args(["/usr/bin/codex", "exec", "go"], cfg, "/x/corral", env)
    assert codex[0] == "/usr/bin/codex" and codex[-2:] == ["exec", "go"]
    assert 'mcp_servers.corral.command="/x/corral"' in codex and 'mcp_servers.corral.args=["mcp"]' in codex
    # the token's name, forwarded from codex's environment; its value never on a command line
    assert 'mcp_servers.corral.env_vars=["CORRAL_URL", "CORRAL_TOKEN", "CORRAL_SESSION"]' in codex
    assert not any("t" == a or '"t"' in a for a in codex), codex
    assert client_args(["aider"], cfg, "/x/corral", env) == ["aider"]


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_the_fence_leaves_corral_the_only_way_to_slurm(slurm_gateway: Gateway, agent_dir: Path) -> None:  # noqa: F811
    """Inside agent run: the munge socket's directory is empty, Slurm's own binaries are
    the shims (even by absolute path), a credential cannot be had; and the agent's job
    still runs on the real Slurm, sent by corral."""
    if shutil.which("bwrap") is None and os.environ.get("CI") != "true":
        pytest.skip("no bubblewrap: run scripts/sandbox-up")
    sock_dir = "/tmp/corral-slurm/munge"
    real = shutil.which("sbatch") or "/usr/bin/sbatch"
    with slurm_gateway.http() as h:
        assert h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "admin"}).status_code == 201
        token = h.post("/v1/tokens", json={"for": "bot", "expires": "1h"}).json()["token"]
    script = (f"echo MUNGE=$(ls -A {sock_dir} | wc -l); {real} --parsable --wrap true > /dev/null; "
              f"echo REAL_SBATCH_IS_SHIM=$?; munge -n > /dev/null 2>&1; echo MUNGE_CRED=$?; "
              "sdiag > /dev/null 2>&1; echo SDIAG=$?; " + LOOP)
    r = agent_run(slurm_gateway, token, script, agent_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "MUNGE=0" in out and "MUNGE_CRED=0" not in out and "SDIAG=0" not in out
    assert "REAL_SBATCH_IS_SHIM=0" in out
    assert "hello from probe" in out and "probe|COMPLETED|0:0" in out, out + r.stderr + _what_jobs_said(slurm_gateway)
    assert os.listdir(sock_dir), "the socket is hidden inside the fence only"
    with slurm_gateway.http() as h:
        jobs = h.get("/v1/jobs", params={"full": "true"}).json()["jobs"]
        assert {j["backend"] for j in jobs} == {"slurm"} and all(j["backend_id"] for j in jobs)


def _what_jobs_said(gw: Gateway) -> str:
    """Each job's state and the end of its stderr, as corral has them: why a job failed, when
    it did (seen once in a CI run: both of this agent's jobs FAILED 1:0 before their
    output's redirect, and the job directories were gone by the time anyone looked)."""
    with gw.http() as h:
        jobs = h.get("/v1/jobs", params={"full": "true"}).json()["jobs"]
        return "".join(f"\njob {j['id']} {j['name']} {j['state']} {j.get('reason')}: "
                       + h.get(f"/v1/jobs/{j['id']}/output", params={"stream": "stderr", "tail": 20}).text[-1500:]
                       for j in jobs)


def test_squeue_json_honours_name_and_partition(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    script = ("sbatch -J keep --wrap 'sleep 3' >/dev/null; sbatch -J other --wrap 'sleep 3' >/dev/null; "
              "squeue --json -n keep; squeue --json -p nosuchpart")
    r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence")
    assert r.returncode == 0, r.stderr
    import json

    first, second = [json.loads(x) for x in r.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert [j["name"] for j in first["jobs"]] == ["keep"] and second["jobs"] == [], r.stdout


def test_the_compiled_launcher_answers_as_the_python_one_with_or_without_the_helper(
        gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    # decision 0013: the shims are a compiled launcher where a C compiler is found; its
    # answers (stdout, stderr, exit code, the caller's directory, stdin) must be the Python
    # launcher's, through the session's helper or, without one, run in Python by itself
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C compiler: the compiled shim launcher cannot be tested")
        pytest.skip("no C compiler")
    (agent_dir / "sub").mkdir(mode=0o777)
    (agent_dir / "sub").chmod(0o777)
    script = ("echo KIND=$(head -c 4 \"$(command -v squeue)\" | tail -c 3); squeue -h -j 999999; echo rc=$?; "
              "sbatch --bogus; echo rc=$?; salloc; echo rc=$?; cd sub; "
              "ID=$(sbatch --parsable -J 'a b' -o o.txt --wrap 'echo x; echo $SLURM_SUBMIT_DIR'); "
              "while squeue -h -j $ID | grep -q .; do sleep 0.3; done; sleep 0.5; sed \"s|$PWD|DIR|\" o.txt; "
              "sacct -X -n -P -j $ID -o JobName; printf 'in\\n' | srun cat; srun sh -c 'exit 7'; echo rc=$?")
    got = {}
    for how, env in (("compiled", {}), ("python", {"CORRAL_SHIM_COMPILED": "0"}),
                     ("no helper", {"CORRAL_SHIM_HELPER": "0"})):
        r = agent_run(gateway, people["bot1"], script, agent_dir, "--no-fence", "--quiet", extra=env)
        got[how] = (r.stdout, r.stderr)
    assert got["compiled"][0].startswith("KIND=ELF\n") and got["python"][0].startswith("KIND=!/")
    assert got["no helper"][0].startswith("KIND=ELF\n")
    want = got["compiled"][0].split("\n", 1)[1]
    assert want.split("\n")[:5] == ["rc=1", "rc=255", "rc=1", "x", "DIR"], got["compiled"]
    assert want.split("\n")[5:] == ["a b", "in", "rc=7", ""], got["compiled"]
    for how in ("python", "no helper"):
        assert (got[how][0].split("\n", 1)[1], got[how][1]) == (want, got["compiled"][1]), how
