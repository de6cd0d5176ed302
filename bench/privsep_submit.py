"""What the privileged submitter (corral/lanes/slurm/privsep_submit.py, decision 0021) adds to a Slurm
submission: ``sudo -n corral-submit prepare`` + ``submit`` (two sudo calls, two isolated
Pythons, sbatch as root with ``--uid``) against one plain ``sbatch`` of the same script
by the service account itself, on the private Slurm (scripts/slurm-up). Needs root: it
makes a service account and a user, installs the helper with scripts/privsep-up into a
directory of its own and a sudoers rule for that account, and removes them after.

    python bench/privsep_submit.py [--quick] [--jobs 20]

Last line: one JSON object (milliseconds per submission, median and p95).
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
SCRIPT = b"#!/bin/bash\ntrue\n"
OPTS = ["--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=100M", "--time=00:01:00"]


def as_user(u: pwd.struct_passwd, argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, user=u.pw_uid, group=u.pw_gid, extra_groups=[],
                          cwd=u.pw_dir, env={"PATH": "/usr/bin:/bin", "HOME": u.pw_dir, "SLURM_CONF": CONF}, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 jobs per arm")
    ap.add_argument("--jobs", type=int, default=20)
    a = ap.parse_args()
    n = 5 if a.quick else a.jobs
    tag = str(os.getpid() % 100000)
    svc_name, user_name = f"bsvc{tag}", f"busr{tag}"
    conf_dir = Path(tempfile.mkdtemp(prefix="corral-bench-submitter-", dir="/tmp"))
    conf_dir.chmod(0o755)
    rule = Path(f"/etc/sudoers.d/corral-bench-{tag}")
    try:
        for name in (svc_name, user_name):
            subprocess.run(["useradd", "--create-home", "--home-dir", f"/tmp/{name}", name], check=True)
            os.chmod(f"/tmp/{name}", 0o711)
        svc, user = pwd.getpwnam(svc_name), pwd.getpwnam(user_name)
        jobs = Path(svc.pw_dir) / "jobs"
        jobs.mkdir(mode=0o755)
        os.chown(jobs, svc.pw_uid, svc.pw_gid)
        helper = conf_dir / "corral-submit"
        subprocess.run([str(ROOT / "scripts" / "privsep-up"), "--dest", str(helper), "--config",
                        str(conf_dir / "submit.toml")], check=True, capture_output=True)
        (conf_dir / "submit.toml").write_text(f'gateway = "{svc_name}"\njobs_dir = "{jobs}"\nslurm_conf = "{CONF}"\n'
                                              f'log = "{conf_dir}/audit.log"\n')
        rule.write_text(f"{svc_name} ALL=(root) NOPASSWD: {helper}\n")
        rule.chmod(0o440)
        plain, helped = [], []
        ids: dict[str, list[str]] = {"plain_sbatch": [], "through_submitter": []}  # Slurm's answer to each
        for i in range(1, n + 1):
            (jobs / str(i)).mkdir(mode=0o711)
            (jobs / str(i) / "out.new").mkdir(mode=0o700)
            (jobs / str(i) / "out.new" / "stdout").touch(mode=0o600)
            for p in (jobs / str(i), jobs / str(i) / "out.new", jobs / str(i) / "out.new" / "stdout"):
                os.chown(p, svc.pw_uid, svc.pw_gid)
            t0 = time.perf_counter()
            said = as_user(svc, ["sbatch", "--parsable", "--job-name=bench-plain", *OPTS,
                                 f"--output={jobs}/{i}/plain.out"], SCRIPT).stdout
            plain.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            as_user(svc, ["sudo", "-n", str(helper), "prepare", str(i), str(user.pw_uid)])
            (jobs / str(i) / "out.new").rename(jobs / str(i) / "out")  # as the gateway does between them
            via = as_user(svc, ["sudo", "-n", str(helper), "submit", str(i), str(user.pw_uid), f"--job-name=corral-{i}",
                                *OPTS], SCRIPT).stdout
            helped.append((time.perf_counter() - t0) * 1000)
            ids["plain_sbatch"].append(said.decode().strip())
            ids["through_submitter"].append(via.decode().strip())

        def summary(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            return {"median_ms": round(statistics.median(xs), 1), "p95_ms": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1)}

        out = {"jobs": n, "plain_sbatch": summary(plain), "through_submitter": summary(helped)}
        print(f"plain sbatch by the service account: {out['plain_sbatch']}")
        print(f"sudo corral-submit prepare + submit (sbatch --uid as root): {out['through_submitter']}")
        # Each submission timed must have been one: Slurm's job id back, every time.
        finish("privsep_submit", out, {arm: bool(got) and all(re.fullmatch(r"\d+(;\S+)?", x) for x in got)
                                       for arm, got in ids.items()})
    finally:
        rule.unlink(missing_ok=True)
        for name in (svc_name, user_name):
            subprocess.run(["scancel", "-u", name], env={**os.environ, "SLURM_CONF": CONF}, capture_output=True)
            subprocess.run(["userdel", "-r", name], capture_output=True)
            shutil.rmtree(f"/tmp/{name}", ignore_errors=True)
        shutil.rmtree(conf_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
