"""``srun`` inside a contained job: the step's tasks run in the job's own allocation, on
its node and in its sandbox (decision 0057).

A corral job is one node (its batch script asks Slurm for ``--nodes=1``), so a step's
tasks are processes of the job: started here, each with Slurm's task variables
(SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_ID ...), their output passed
through (``-l``: each line prefixed ``TASK: ``), srun's exit code the highest of theirs,
and a failed task said as Slurm's srun says it. What Slurm would refuse (more CPUs than
the job has, several nodes) is refused in its words. They are not steps in Slurm's
accounting (sacct lists the job, not its steps): launching one needs slurmd, munge and
the network, which the sandbox keeps from the job on purpose.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import IO, Any, TextIO

from corral.edges.shims.base import ShimError

STEPS_FILE = "/tmp/.corral-slurm-steps"
"""One byte per step started in this job (its private /tmp): the next step's id."""


def run(ns: Any, ntasks_given: int | None, cpus_per_task: int | None, stdin: bytes | None) -> int:
    """The step's tasks, to their end -> srun's exit code. ``stdin``: what every task reads
    (None: the one task inherits srun's own)."""
    env = os.environ
    job = env.get("SLURM_JOB_ID", "")
    ntasks = ntasks_given or int(env.get("SLURM_NTASKS") or 1)
    cpus = int(env.get("SLURM_CPUS_ON_NODE") or 0)
    if cpus and ntasks * (cpus_per_task or 1) > cpus:
        raise ShimError(f"Unable to create step for job {job}: More processors requested than permitted")
    step = _next_step()
    host = socket.gethostname().split(".")[0]
    base = {**env, "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_NODELIST": host, "SLURM_NODEID": "0", "SLURMD_NODENAME": host}
    if cpus_per_task:
        base["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)
    lock = threading.Lock()
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    for t in range(ntasks):
        try:
            p = subprocess.Popen(ns.command, env={**base, "SLURM_PROCID": str(t), "SLURM_LOCALID": str(t)},
                                 stdin=None if stdin is None else subprocess.PIPE,
                                 stdout=subprocess.PIPE if ns.label else None,
                                 stderr=subprocess.PIPE if ns.label else None)
        except OSError as e:
            print(f"slurmstepd: error: execve(): {ns.command[0]}: {e.strerror}", file=sys.stderr)
            _stop(procs)
            print(f"srun: error: {host}: task {t}: Exited with exit code 2", file=sys.stderr)
            return 2
        procs.append(p)
        if ns.label:
            pumps += [_pump(p.stdout, sys.stdout, t, lock), _pump(p.stderr, sys.stderr, t, lock)]
        if stdin is not None:
            _feed(p, stdin)
    _forward(procs)
    codes = [p.wait() for p in procs]
    for th in pumps:
        th.join()
    return _said(codes, host)


def _next_step() -> int:
    """This job's next step id (0, 1, ...), counted in its private /tmp under a lock."""
    try:
        with open(STEPS_FILE, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            n = f.tell()
            f.write(b".")
            return n
    except OSError:
        return 0


def _pump(src: IO[bytes] | None, dst: TextIO, task: int, lock: threading.Lock) -> threading.Thread:
    """Each line of a task's stream to ours, prefixed with its task number (srun -l)."""
    def copy() -> None:
        assert src is not None
        for line in iter(src.readline, b""):
            with lock:
                out = dst.buffer
                out.write(f"{task}: ".encode() + line)
                out.flush()

    th = threading.Thread(target=copy, daemon=True)
    th.start()
    return th


def _feed(p: subprocess.Popen[bytes], data: bytes) -> None:
    def write() -> None:
        assert p.stdin is not None
        try:
            p.stdin.write(data)
            p.stdin.close()
        except OSError:
            pass

    threading.Thread(target=write, daemon=True).start()


def _forward(procs: list[subprocess.Popen[bytes]]) -> None:
    """A signal srun gets (the job's cancel, an agent's kill) goes to every task, as Slurm's does."""
    def send(sig: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, send)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def _said(codes: list[int], host: str) -> int:
    """Slurm's words for each task that failed, and srun's exit code: the highest."""
    rc = 0
    for t, code in enumerate(codes):
        if code > 0:
            print(f"srun: error: {host}: task {t}: Exited with exit code {code}", file=sys.stderr)
            rc = max(rc, code)
        elif code < 0:
            name = {int(signal.SIGKILL): "Killed", int(signal.SIGTERM): "Terminated"}.get(-code, f"Signal {-code}")
            print(f"srun: error: {host}: task {t}: {name}", file=sys.stderr)
            rc = max(rc, 128 - code)
    return rc
