"""The configuration reference is the settings' own declarations (docs/config.md is what
`corral config reference` writes from corral/core/config.py, every key with its type,
default, meaning and an example that the settings accept), and a typo in corral.toml is
answered with the one key meant, in the admin's terms, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.core.config import PARTS, Settings, load_settings
from corral.core.config_reference import entries, render
from corral.core.errors import InvalidRequest

ROOT = Path(__file__).resolve().parent.parent
CORRAL = [sys.executable, "-m", "corral.entry"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return {**env, **extra}


def test_docs_config_md_is_what_the_declarations_write(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    subprocess.run([*CORRAL, "config", "reference", "--out", str(out)], check=True, env=_env(), timeout=60)
    committed = (ROOT / "docs" / "config.md").read_text()
    assert out.read_text() == committed == render(), \
        "docs/config.md is stale: run `corral config reference --out docs/config.md`"


def test_every_key_has_its_type_default_meaning_and_an_example_the_settings_accept() -> None:
    found = entries()
    names = {(e.table, e.key) for e in found}
    assert names == {(None, k) for k in Settings.model_fields if k not in PARTS} | \
        {(t, k) for t, m in PARTS.items() for k in m.model_fields}
    assert len(found) > 100
    doc = render()
    for e in found:
        assert e.meaning and e.type and e.default, e
        name = f"{e.table}.{e.key}" if e.table else e.key
        assert f"### `{name}`" in doc
        value = tomllib.loads(e.example)[e.key]
        given = {e.table: {e.key: value}} if e.table else {e.key: value}
        if e.key in ("tls_cert", "tls_key"):  # a pair: one alone is refused (tested below)
            given = {"tls_cert": "/c.pem", "tls_key": "/k.pem"}
        Settings(**given)  # the example is a value the settings take


def test_a_typo_is_answered_with_the_key_meant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CORRAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    cases = {"prot = 1\n": ("prot", "port"), "[fastlane]\ncpu = 4\n": ("fastlane.cpu", "fastlane.cpus"),
             "[http]\nmax_conections = 99\n": ("http.max_conections", "http.max_connections"),
             "cpus = 4\n": ("cpus", "fastlane.cpus"), "[sandbox]\nseccom = false\n": ("sandbox.seccom", "sandbox.seccomp")}
    for text, (bad, meant) in cases.items():
        (tmp_path / "corral.toml").write_text(text)
        with pytest.raises(InvalidRequest) as e:
            load_settings()
        assert f"unknown key '{bad}': did you mean '{meant}'?" in e.value.message
        assert len(e.value.message) < 200 + len(str(tmp_path)), e.value.message  # one name, not 120
        assert "docs/config.md" in (e.value.hint or "")
    (tmp_path / "corral.toml").write_text('tls_cert = "/c.pem"\n')
    with pytest.raises(InvalidRequest, match="tls_cert and tls_key go together"):
        load_settings()


def test_the_cli_refuses_a_typo_with_exit_2_and_says_which_key(tmp_path: Path) -> None:
    (tmp_path / "corral.toml").write_text("[slurm]\nagent_nices = 10\n")
    env = _env(CORRAL_HOME=str(tmp_path))
    for argv in (["serve", "--port", "0"], ["config", "check"]):
        r = subprocess.run([*CORRAL, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "unknown key 'slurm.agent_nices': did you mean 'slurm.agent_nice'?" in r.stderr
        assert "Traceback" not in r.stderr and "valid keys" not in r.stderr
    r = subprocess.run([*CORRAL, "--json", "config", "check"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "did you mean 'slurm.agent_nice'" in json.loads(r.stdout)["error"]["message"]
    (tmp_path / "corral.toml").write_text("[slurm]\nagent_nice = 10\n")
    r = subprocess.run([*CORRAL, "--json", "config", "check"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["exists"] is True


def test_a_typo_in_a_variable_is_named_with_the_one_meant(tmp_path: Path) -> None:
    env = _env(CORRAL_HOME=str(tmp_path), CORRAL_FASTLANE__CPU="3")
    r = subprocess.run([*CORRAL, "config", "check"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "CORRAL_FASTLANE__CPU is no setting: did you mean CORRAL_FASTLANE__CPUS?" in r.stderr
