"""Options Slurm 22.05's commands have (from their man pages), so that a shim tells a
real flag it does not serve ("corral's sbatch does not support --ntasks-per-core yet")
from a typo (Slurm's own "unrecognized option"). And the Slurm commands corral does not
serve at all, each with what to use instead."""

from __future__ import annotations

_ALLOC = ("account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint "
          "container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline "
          "delay-boot dependency distribution error exclude exclusive export export-file extra-node-info "
          "get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags "
          "hint hold ignore-pbs input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem "
          "mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes "
          "ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output overcommit "
          "oversubscribe parsable partition power prefer priority profile propagate qos quiet reboot requeue "
          "reservation signal sockets-per-node spread-job switches test-only thread-spec threads-per-core time "
          "time-min tmp uid use-min-nodes verbose version wait wait-all-nodes wckey wrap").split()
OPTIONS: dict[str, set[str]] = {
    "sbatch": set(_ALLOC) | set("-b -B -F -i -k -L -m -M -O -s -S -v -V".split()),
    "srun": set(_ALLOC) | set(("label unbuffered kill-on-bad-exit multi-prog pty mpi overlap exact cpu-bind "
                                "slurmd-debug task-epilog task-prolog immediate jobid het-group x11 send-libs "
                                "accel-bind bcast compress disable-status epilog prolog relative resv-ports "
                                "-l -u -K -X -Z -r -T -I -E -B -F -i -k -L -m -M -O -s -S -v -V").split()),
    "squeue": set(("start steps sort iterate local federation sibling licenses reservation qos account "
                   "nodelist clusters hide array-unique only-job-state yaml usage version verbose noconvert "
                   "-s -S -i -L -R -q -A -w -M -V -v").split()),
    "sacct": set(("allclusters accounts associations clusters completion constraints delimiter duplicates "
                  "federation helpformat local long nodelist noconvert partition qos reason timelimit-max "
                  "timelimit-min truncate uid units use-local-uid wckeys whole-hetjob yaml array batch-script "
                  "env-vars -A -c -d -e -f -g -i -I -k -K -L -M -N -q -r -R -T -U -W -x -V -v").split()),
    "scancel": set("account clusters nodelist qos reservation sibling wckey ctld -A -M -w -q -R".split()),
    "sinfo": set(("dead responding noconvert federation local clusters iterate node reservation sort usage "
                  "version -d -r -i -n -S -T -M -V").split()),
}

INSTEAD: dict[str, str] = {
    "salloc": "corral runs jobs batch-style: sbatch (or corral submit) a script, or srun a command",
    "sstat": "corral usage ID reports what a job used (CPU time, peak memory) once it ends",
    "sprio": "corral plan (MCP plan_job) estimates when a job would start",
    "sshare": "corral whoami shows your budget and what is left of it",
    "sacctmgr": "accounts are corral's: corral whoami, corral token mint",
    "sreport": "corral analyze (admins) reports what agents take of the facility",
    "sbcast": "jobs see your files where they are: no broadcast is needed",
    "sattach": "corral logs ID (--tail) reads a running job's output",
    "strigger": "corral wait ID or MCP wait_for_events tell you when a job ends",
    "scrontab": "corral does not run recurring jobs: submit each run",
    "sdiag": "corral's own state: corral facility; the controller is corral's to watch",
    "smap": "corral jobs lists your jobs",
    "sview": "corral jobs lists your jobs",
}
"""Slurm commands a corral agent session has no use for, each with corral's way."""


def is_known(prog: str, flag: str) -> bool:
    """Whether ``flag`` ('--nice=5', '-l') is one of Slurm's own options of ``prog``."""
    name = flag.split("=", 1)[0]
    known = OPTIONS.get(prog, set())
    return (name.startswith("--") and name[2:] in known) or (len(name) == 2 and name in known)
