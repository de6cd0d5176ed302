"""One agent trial iteration, the usual way against corral's image plus workspace.

    python bench/storage.py [--quick] [--trials 20] [--requirements "numpy pandas"]

The iteration: get an environment with numpy and pandas, run
``python -c "import numpy, pandas"``, run a small test suite (unittest, 24 modules and
their tests) in a fresh copy of the project (--quick: numpy alone, two trials). Both
arms in one run, on one machine:

- **plain**, as agents do it today: ``uv venv`` + ``uv pip install`` into the trial's
  directory on the shared path, ``cp -r`` of the project there, the import and the suite
  from that venv and that copy;
- **corral**: ``POST /v1/env/build`` (the image is built once: ``image_build_s``; the
  next request for it answers at once: ``image_reuse_ms``), ``POST /v1/workspaces`` over
  the project, then the import and the suite as one job with ``image`` and
  ``workspace``, through a real gateway (local backend; agents' jobs in the sandbox).

The shared filesystem is a directory (``--shared``, default under /var/tmp) standing
for it: the project, the plain trials and corral's image store live there. Metadata
calls are counted the same way in both arms: ``strace -f -y -e trace=%file,getdents64``
and corral.storage.meta.count, keeping calls whose path lies under the shared path.
Plain: the whole iteration traced. corral: the trial job (the gateway samples it,
``[storage] meta_sample = 1``) plus what the gateway itself does on the shared path for
it (the fork's manifest walk over the base, the image's mount), each traced alone.
A read through the overlay of a file in the base is the kernel's, not the job's call,
and is not counted: that is the limit of counting calls by path (docs/benchmarks.md).

``import_ms``: the first import after the environment appeared (the venv just
installed; the image just mounted), median of 3 runs, untraced. ``trial_bytes``: bytes
that ``--trials`` parallel trials leave on disk (du): plain, their venvs and copies;
corral, the image once and each workspace's upper layer after its job ran the suite.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, sponsored_agents  # noqa: E402
from corral.storage.meta import TRACE, count  # noqa: E402

def importing(reqs: list[str]) -> str:
    """The trial's import: each requirement, as a module (numpy, pandas)."""
    return "import " + ", ".join(r.replace("-", "_") for r in reqs)


def uv() -> str:
    return str(Path(sys.executable).with_name("uv"))


def make_project(root: Path, modules: int = 24) -> Path:
    p = root / "project"
    (p / "calc").mkdir(parents=True)
    (p / "tests").mkdir()
    (p / "calc" / "__init__.py").write_text("")
    (p / "tests" / "__init__.py").write_text("")
    for i in range(modules):
        (p / "calc" / f"m{i}.py").write_text(f"import numpy as np\n\ndef f{i}(x):\n    return np.asarray(x).sum() + {i}\n")
        (p / "tests" / f"test_m{i}.py").write_text(
            f"import unittest\nfrom calc.m{i} import f{i}\n\nclass T(unittest.TestCase):\n"
            f"    def test_it(self):\n        self.assertEqual(f{i}([1, 2]), {3 + i})\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(p)], check=True)
    return p


def traced(argv: list[str], out: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    r = subprocess.run(["strace", "-f", "-qq", "-y", "-e", f"trace={TRACE}", "-o", str(out), "--", *argv],
                       cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed: {r.stderr[-500:]}")


def shared_ops(trace: Path, shared: Path) -> int:
    with open(trace, errors="replace") as f:
        return count(f, [str(shared)])[1]


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def first_import_ms(python: str, cwd: Path, stmt: str) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([python, "-c", stmt], cwd=cwd, check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def plain_trial(i: int, shared: Path, project: Path, reqs: list[str], trace_dir: Path | None) -> Path:
    """One trial the usual way: venv, install, copy, import, suite, all on the shared path."""
    stmt = importing(reqs)
    t = shared / "plain" / f"trial{i}"
    t.mkdir(parents=True)
    env = {**os.environ, "UV_SYSTEM_CERTS": "1", "UV_NO_PROGRESS": "1"}
    steps = [([uv(), "venv", "--quiet", "--python", "/usr/bin/python3", str(t / "venv")], None),
             ([uv(), "pip", "install", "--quiet", "--link-mode", "copy", "--python", str(t / "venv" / "bin" / "python"),
               *reqs], None),
             (["cp", "-r", str(project), str(t / "project")], None),
             ([str(t / "venv" / "bin" / "python"), "-c", stmt], t),
             ([str(t / "venv" / "bin" / "python"), "-m", "unittest", "discover", "-q", "-s", "tests"], t / "project")]
    for n, (argv, cwd) in enumerate(steps):
        if trace_dir is not None:
            traced(argv, trace_dir / f"plain{n}.strace", cwd, env)
        else:
            subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
    return t


def gateway_side_ops(shared: Path, project: Path, image: Path, scratch: Path, tmp: Path) -> int:
    """What the gateway does on the shared path for one trial: the fork's manifest walk and
    the image's mount (on a fresh mount point), each traced in a process of its own."""
    walk = tmp / "walk.strace"
    traced([sys.executable, "-c", f"from corral.storage.basework import manifest; "
                                  f"manifest({{'base': {str(project)!r}}})"], walk)
    at = scratch / "bench-mount"
    mount = tmp / "mount.strace"
    traced([sys.executable, "-c", f"from pathlib import Path; from corral.storage.mounts import mount_image; "
                                  f"mount_image(Path({str(image)!r}), Path({str(at)!r}))"], mount)
    subprocess.run(["umount", "-l", str(at)], check=False)
    # Python's own start-up reads nothing under the shared path: what is left is the work.
    return shared_ops(walk, shared) + shared_ops(mount, shared)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 trials instead of 20, numpy alone unless --requirements")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--requirements", default=None, help="what the environment holds (default 'numpy pandas')")
    ap.add_argument("--shared", type=Path, default=None, help="the directory standing for the shared filesystem")
    a = ap.parse_args()
    trials = 2 if a.quick else a.trials
    # The image build (a cold download, an install, a squashfs) is most of a quick run: with
    # pandas too, two trials took 39 CPU-s.
    reqs = (a.requirements or ("numpy" if a.quick else "numpy pandas")).split()
    missing = [t for t in ("strace", "mksquashfs", "bwrap") if shutil.which(t) is None]
    if missing or os.geteuid() != 0:
        sys.exit(f"needs root and {missing or 'nothing else'}: run scripts/storage-up and scripts/sandbox-up as root")
    shared = a.shared or Path(tempfile.mkdtemp(prefix="corral-bench-shared-", dir="/var/tmp"))
    shared.mkdir(parents=True, exist_ok=True)
    os.chmod(shared, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-storage-"))
    try:
        run(a, trials, reqs, shared, tmp)
    finally:  # a failed run leaves no 2 GB of trials behind either
        cleanup(tmp, shared, a.shared is None)


def run(a: argparse.Namespace, trials: int, reqs: list[str], shared: Path, tmp: Path) -> None:
    project = make_project(shared)
    result: dict[str, object] = {"trials": trials, "requirements": reqs}

    # -- plain ------------------------------------------------------------------------
    print(f"plain: {trials} trials (venv + install + copy + import + suite on {shared})", file=sys.stderr)
    t0 = time.monotonic()
    first = plain_trial(0, shared, project, reqs, tmp)
    per_step = [shared_ops(tmp / f"plain{n}.strace", shared) for n in range(5)]
    plain_ops = sum(per_step)
    plain_first_s = time.monotonic() - t0
    import_plain = first_import_ms(str(first / "venv" / "bin" / "python"), first, importing(reqs))
    for i in range(1, trials):
        plain_trial(i, shared, project, reqs, None)
    plain_bytes = du(shared / "plain")

    # -- corral -----------------------------------------------------------------------
    print("corral: image + workspace through a gateway", file=sys.stderr)
    gw = GatewayProcess("--cpus", str(max(2, os.cpu_count() or 2)), env={
        "CORRAL_STORAGE__IMAGES_DIR": str(shared / "images"),
        "CORRAL_STORAGE__SHARED_PATHS": json.dumps([str(shared)]), "CORRAL_STORAGE__META_SAMPLE": "1.0",
        # the agent's build installs in its own sandbox: the index through corral's egress proxy
        "CORRAL_SANDBOX__ALLOW_HOSTS": json.dumps(["pypi.org", "files.pythonhosted.org"])})
    try:
        token = sponsored_agents(gw, 1)[0]
        import httpx

        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=600) as h:
            files = {"requirements.txt": "\n".join(reqs) + "\n"}
            t0 = time.monotonic()
            r = h.post("/v1/env/build", json={"files": files, "name": "bench"}).json()
            while r["state"] == "building":
                time.sleep(0.2)
                r = h.get(f"/v1/env/{r['digest']}").json()
            if r["state"] != "ready":
                raise SystemExit(f"the image build failed: {r}")
            build_s = time.monotonic() - t0
            reuse = []
            for _ in range(5):
                t1 = time.perf_counter()
                again = h.post("/v1/env/build", json={"files": files}).json()
                reuse.append((time.perf_counter() - t1) * 1000)
                assert again["state"] == "ready" and again["image"] == r["image"]
            ws = [h.post("/v1/workspaces", json={"base": str(project)}).json() for _ in range(trials)]
            suite = (f"python -c '{importing(reqs)}' && python -m unittest discover -q -s tests")
            jobs = h.post("/v1/jobs/batch", json={"jobs": [{"command": suite, "image": "bench",
                                                           "workspace": w["workspace"]} for w in ws]}).json()["jobs"]
            done = h.post("/v1/jobs/wait", json={"ids": [j["id"] for j in jobs], "timeout": 600}).json()["jobs"]
            bad = [j for j in done if j["state"] != "COMPLETED"]
            if bad:
                out = h.get(f"/v1/jobs/{bad[0]['id']}/output", params={"stream": "stderr"}).json()
                raise SystemExit(f"a corral trial failed: {bad[0]} {out.get('data', '')[-800:]}")
            ops: list[int] = []
            calls: list[int] = []
            for j in jobs:
                for _ in range(100):
                    u = h.get(f"/v1/jobs/{j['id']}/usage").json()
                    if "metadata_ops" in u:
                        ops.append(u["metadata_ops"]["on_shared_paths"])
                        calls.append(u["metadata_ops"]["calls"])
                        break
                    time.sleep(0.1)
            info = h.get("/v1/facility").json()["storage"]
            scratch = Path(info["scratch"])
            mount = scratch / "images" / r["image"]
            import_corral = first_import_ms(str(mount / "bin" / "python"), tmp, importing(reqs))
            image = shared / "images" / f"{r['image']}.sqsh"
            side = gateway_side_ops(shared, project, image, scratch, tmp)
            corral_ops = (statistics.median(ops) if ops else 0) + side
            uppers = sum(h.get(f"/v1/workspaces/{w['workspace']}").json()["upper_bytes"] for w in ws)
            corral_bytes = image.stat().st_size + uppers
            for w in ws:
                h.post(f"/v1/workspaces/{w['workspace']}/discard")
    finally:
        gw.stop()
        from corral.core.config import StorageSettings
        from corral.storage.mounts import unmount_all
        from corral.gateway.storage_verbs import scratch_dir

        scratch = scratch_dir(StorageSettings(), gw.home.resolve())
        unmount_all(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    result.update({
        "meta_ops_plain": plain_ops, "meta_ops_corral": corral_ops, "meta_ops_corral_job": statistics.median(ops),
        "meta_calls_corral_job_all_paths": statistics.median(calls),
        "meta_ops_corral_gateway": side, "meta_ratio": round(plain_ops / max(1, corral_ops), 1),
        "import_ms_plain": round(import_plain, 1), "import_ms_corral": round(import_corral, 1),
        "trial_bytes_plain": plain_bytes, "trial_bytes_corral": corral_bytes,
        "bytes_ratio": round(plain_bytes / max(1, corral_bytes), 1),
        "image_build_s": round(build_s, 2), "image_reuse_ms": round(statistics.median(reuse), 1),
        "plain_first_trial_s": round(plain_first_s, 2),
        "meta_ops_plain_by_step": dict(zip(["venv", "install", "copy", "import", "suite"], per_step)),
    })
    # The corral job's count on shared paths is 0 when all it reads is the image and its
    # workspace: that is a measurement only if its sampler saw calls at all (on any path).
    finish("storage", result, {"plain metadata": plain_ops > 0, "plain bytes": plain_bytes > 0,
                               "corral job metadata": bool(calls) and statistics.median(calls) > 0,
                               "corral gateway metadata": side > 0, "corral bytes": corral_bytes > 0,
                               "imports": import_plain > 0 and import_corral > 0})


def cleanup(tmp: Path, shared: Path, ours: bool) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    if ours:
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    main()
