"""What a shim call costs the login node, beside Slurm's own command: CPU time (user +
system, from the child's rusage) per call of ``squeue -h -j ID`` and ``sbatch --parsable``,
real Slurm's against corral's shims (as ``corral agent run`` installs them, with an
agent's token, against a gateway on the private Slurm). Interleaved, so the machine's
drift hits both arms alike. The gateway's own CPU is not counted: it is one process
for every agent, where a shim is one process per call.

    bench/shim_cost.py [--quick] [--runs N]

The shim arm counts the launcher's CPU and that of the helper's child serving the call
(corral/edges/shims/helper.py): the compiled launcher (launcher.c, decision 0013) where a C
compiler is found; ``python_launcher_shim_cpu_ms`` is decision 0008's Python launcher
with the same helper, ``shim_without_helper_cpu_ms`` the shim run on its own.

Last line: one JSON object (squeue_cpu_ms, shim_cpu_ms, ratio, and the same for sbatch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, sponsored_agents  # noqa: E402

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"


def cpu_ms(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    """(CPU ms of one run of argv and its children, its stdout)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exec at once, nothing of the parent's Python runs
        os.chdir(cwd)
        os.dup2(w, 1)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(r)
        os.execvpe(argv[0], argv, env)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status, ru = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({os.waitstatus_to_exitcode(status)})")
    return (ru.ru_utime + ru.ru_stime) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 runs of each arm")
    ap.add_argument("--runs", type=int, default=40, help="runs of each arm (default 40)")
    args = ap.parse_args()
    runs = 10 if args.quick else args.runs
    if not Path(SLURM_CONF).exists():
        raise SystemExit(f"no Slurm at {SLURM_CONF}: run scripts/slurm-up first")
    from corral.edges.cli.agent_run import shim_dir, start_helper, stop_helper
    from corral.edges.shims.helper import children_cpu_ms, launcher

    gw = GatewayProcess("--backend", "slurm", env={"SLURM_CONF": SLURM_CONF, "CORRAL_FASTLANE": "false"})
    work = tempfile.mkdtemp(prefix="corral-shimcost-")
    os.chmod(work, 0o777)
    try:
        token = sponsored_agents(gw, 1)[0]
        shims = shim_dir(Path(work) / "shims")
        if (shims / "corral-shim").read_bytes()[:4] != b"\x7fELF":
            print("note: no C compiler here: the shims are the Python launcher", file=sys.stderr)
        pydir = Path(work) / "py"  # decision 0008's Python launcher, beside the compiled one (0013)
        pydir.mkdir()
        (pydir / "squeue").write_text(launcher(str(Path(__file__).resolve().parent.parent)))
        (pydir / "squeue").chmod(0o755)
        helper, sock = start_helper(Path(work))
        if sock is None:
            raise SystemExit("the shim helper did not start")
        base = {**os.environ, "SLURM_CONF": SLURM_CONF}
        agent = {**base, "CORRAL_URL": gw.url, "CORRAL_TOKEN": token, "CORRAL_SESSION": "shim-cost",
                 "CORRAL_SHIM_CACHE": work, "CORRAL_SHIM_SOCKET": sock}
        alone = {k: v for k, v in agent.items() if k != "CORRAL_SHIM_SOCKET"}

        def shim(argv: list[str], env: dict[str, str]) -> float:
            """The launcher's CPU plus what the helper's child for this call used."""
            before = children_cpu_ms(sock) if env is agent else 0.0
            ms, _ = cpu_ms(argv, env, work)
            if env is not agent:
                return ms
            child = children_cpu_ms(sock) - before
            if argv[0].startswith(str(shims)):  # the compiled launcher's share, and the helper's
                arms["launcher"].append(ms)
                arms["helper_child"].append(child)
            return ms + child

        sbatch = ["--parsable", "-t", "1", "-o", "/dev/null", "--wrap", "true"]
        _, real_id = cpu_ms(["sbatch", "--parsable", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"], base, work)
        _, shim_id = cpu_ms([str(shims / "sbatch"), "--parsable", "-t", "5", "-o", "/dev/null", "--wrap",
                             "sleep 300"], agent, work)
        arms: dict[str, list[float]] = {"squeue": [], "shim_squeue": [], "sbatch": [], "shim_sbatch": [],
                                        "python_floor": [], "shim_alone_squeue": [], "py_launcher_squeue": [], "launcher": [],
                                        "helper_child": []}
        py = os.path.realpath(sys.executable)
        for _ in range(runs):
            arms["squeue"].append(cpu_ms(["squeue", "-h", "-j", real_id.strip()], base, work)[0])
            arms["shim_squeue"].append(shim([str(shims / "squeue"), "-h", "-j", shim_id.strip()], agent))
            arms["shim_alone_squeue"].append(shim([str(shims / "squeue"), "-h", "-j", shim_id.strip()], alone))
            arms["py_launcher_squeue"].append(shim([str(pydir / "squeue"), "-h", "-j", shim_id.strip()], agent))
            arms["sbatch"].append(cpu_ms(["sbatch", *sbatch], base, work)[0])
            arms["shim_sbatch"].append(shim([str(shims / "sbatch"), *sbatch], agent))
            arms["python_floor"].append(cpu_ms([py, "-S", "-c", "pass"], base, work)[0])
        subprocess.run(["scancel", real_id.strip()], env=base, check=False)
        subprocess.run([str(shims / "scancel"), shim_id.strip()], env=agent, check=False)
        stop_helper(helper)
    finally:
        gw.stop()
    med = {k: round(statistics.median(v), 1) if v else 0.0 for k, v in arms.items()}

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    out = {"bench": "shim_cost", "runs": runs, "squeue_cpu_ms": med["squeue"], "shim_cpu_ms": med["shim_squeue"],
           "ratio": ratio(med["shim_squeue"], med["squeue"]), "sbatch_cpu_ms": med["sbatch"],
           "shim_sbatch_cpu_ms": med["shim_sbatch"], "sbatch_ratio": ratio(med["shim_sbatch"], med["sbatch"]),
           "python_floor_cpu_ms": med["python_floor"], "shim_without_helper_cpu_ms": med["shim_alone_squeue"],
           "python_launcher_shim_cpu_ms": med["py_launcher_squeue"],
           "launcher_cpu_ms": med["launcher"], "helper_child_cpu_ms": med["helper_child"], "target_ratio": 2.0, "load_avg_1m": os.getloadavg()[0]}
    for k in arms:
        print(f"{k:>13}: median {med[k]} ms CPU per call")
    # Every arm used some CPU (a zero median is a process that did not run), and both
    # squeue arms asked about a job that exists: each sbatch, real and shimmed, gave its id.
    asked = real_id.strip().isdigit() and shim_id.strip().isdigit()
    finish("shim_cost", out, {**{k: med[k] > 0 for k in arms}, "job_ids": asked})


if __name__ == "__main__":
    main()
