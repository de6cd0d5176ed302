"""sbatch --export through the shims (corral/edges/shims/export.py, decision 0045): what
of the submitting shell reaches the job. Slurm's own meaning of each form is checked
against the real Slurm by the compat corpus (i50_export_*); here, what corral leaves out
on purpose, which Slurm would send."""

from __future__ import annotations

import pytest

from corral.edges.shims.export import MAX_ONE, chosen, exported

SHELL = {"MYVAR": "x", "GITHUB_TOKEN": "ghp_" + "a" * 36, "DB_PASSWORD": "hunter2", "AWS_SECRET_ACCESS_KEY": "s",
         "INNOCENT": "ghp_" + "b" * 36, "CORRAL_TOKEN": "t", "CORRAL_URL": "http://x", "SLURM_CONF": "/etc/s.conf",
         "PATH": "/shims:/usr/bin", "TMPDIR": "/home/a/tmp", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
         "BASH_ENV": "/home/a/.bashrc", "PWD": "/w", "SHLVL": "2", "BASH_FUNC_f%%": "() { :; }",
         "BIG": "y" * (MAX_ONE + 1), "LANG": "C.UTF-8"}


def test_all_sends_the_shell_but_secrets_and_the_sandboxs_own() -> None:
    assert chosen("ALL", SHELL) == {"MYVAR": "x", "LANG": "C.UTF-8"}
    assert chosen(None, SHELL) == chosen("ALL", SHELL)  # Slurm's default


def test_the_other_forms_mean_what_they_mean_to_slurm() -> None:
    assert chosen("NONE", SHELL) == {}
    assert chosen("MYVAR,OTHER=given", SHELL) == {"MYVAR": "x", "OTHER": "given"}
    assert chosen("ALL,OTHER=given", SHELL) == {"MYVAR": "x", "LANG": "C.UTF-8", "OTHER": "given"}
    assert chosen("UNSET_ONE", SHELL) == {}
    # a name asked for by name is sent, even one that looks like a secret: the agent asked
    assert chosen("GITHUB_TOKEN", SHELL) == {"GITHUB_TOKEN": SHELL["GITHUB_TOKEN"]}


def test_values_reach_the_job_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's export lines, run by bash, give back each value byte for byte."""
    import subprocess

    value = "a  b'c; $(touch /tmp/never) `x` \\ \"q\" *"
    monkeypatch.setenv("MSG", value)
    script = "\n".join(exported("MSG")) + '\nprintf %s "$MSG"'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout == value
