"""How a Slurm job's batch shell runs the work and passes signals on to it: the work in
the background, the signals job_control sends forwarded to it (through the sandbox), Slurm's
notice before a preemption or the walltime, and the requeue of a job told of a preemption
(corral/lanes/slurm/script.py writes these lines into the batch script)."""

from __future__ import annotations

import signal as _signal

from corral.lanes.slurm.tiers import NOTICE

FORWARDED = ("HUP", "INT", "QUIT", "USR1", "USR2", "CONT", "TSTP")
"""Signals job_control may send a Slurm job, passed on by its batch shell to the work
(TERM and KILL are Slurm's own: a cancel, a walltime)."""


def run_and_wait(run: str, contained: bool, notice: tuple[str, int, bool] | None, env_fd: int) -> list[str]:
    """The lines that start ``run`` (the work, in the background) and wait for it, passing
    on the signals ``FORWARDED`` names; ``rc`` is its status after. Contained, the sandbox is
    tried again (three times in all) when it was not set up: bwrap fails if a path it hides
    is gone between the script's look at it and its mount (another user's home that userdel
    removed at that instant: "Can't mkdir ...: Read-only file system"), and the job had not
    begun then. What says so is the descriptor of the job's environment (``env_fd``): the
    last step before the work reads it through the script's own open file, so its offset
    is still 0 only if nothing of the job ran. A signal (a cancel) ends the tries.
    ``notice``: Slurm's notice (``notice_lines``)."""
    target = "$(for p in $(pgrep -P $w); do pgrep -P $p; done)" if contained else "$w"
    noted = "corral_signalled=1; " if contained else ""
    noted = "corral_trapped=1; " + noted
    # A wait that a trap interrupts answers 128+N, not the work's status; if the work ended
    # meanwhile (the signal's own handler exits at once) its status is still unread: wait
    # again (127 there: a trap came just after a wait that read it).
    wait = ["w=$!", f"_fwd() {{ {noted}kill -s \"$1\" {target} 2>/dev/null; }}",
            "for s in " + " ".join(FORWARDED) + "; do trap \"_fwd $s\" $s; done",
            *(notice_lines(notice, target, noted) if notice else []),
            "while :; do corral_trapped=; wait $w; rc=$?; kill -0 $w 2>/dev/null && continue",
            '  if [ -n "$corral_trapped" ] && [ "$rc" -gt 128 ]; then wait $w; corral_rc=$?; [ "$corral_rc" = 127 ] || rc=$corral_rc; fi; '
            "break; done"]
    after = requeue_lines(notice[0]) if notice else []
    if not contained:
        return [run, *wait, *after]
    return ["corral_signalled=", "for corral_try in 1 2 3; do", run, *wait,
            '[ "$rc" = 0 ] || [ -n "$corral_signalled" ] || [ "$corral_try" = 3 ] && break',
            f"read -r _ corral_read < /proc/$$/fdinfo/{env_fd}",
            '[ "$corral_read" = 0 ] || break',
            'echo "corral: the sandbox was not set up (a path it hides changed as the job started); trying again" >&2',
            "done", *after]


def notice_lines(notice: tuple[str, int, bool], target: str, noted: str) -> list[str]:
    """Slurm's notice (``NOTICE``, to this shell alone: ``--signal=B:``) at a preemption or
    before the walltime, passed on as the job's own signal to what runs inside the sandbox
    (Slurm's TERM at a preemption reaches every process at once, bwrap too, whose end ends
    the sandbox: no time to checkpoint). Not asked (an opportunistic job's default), it is
    sent only to a process that handles it (SigCgt): USR1's default action is to die, and
    a job that never heard of it runs on through its grace as Slurm would have it (it may
    finish there). ``corral_notice``: the job was told (``requeue_lines``)."""
    name, _, asked = notice
    bit = _signal.Signals["SIG" + name].value - 1
    send = (f"corral_notice=1; kill -s {name} {target} 2>/dev/null" if asked else
            f'for p in {target}; do m=$(sed -n "s/^SigCgt:[[:space:]]*//p" /proc/$p/status 2>/dev/null); '
            f'[ -n "$m" ] && (( (0x$m >> {bit}) & 1 )) && kill -s {name} $p 2>/dev/null && corral_notice=1; done')
    return ["corral_notice=", f"_notice() {{ {noted}{send}; }}", f"trap _notice {NOTICE}"]


def requeue_lines(name: str) -> list[str]:
    """After the work ended: if it was told of a preemption (its signal passed on, and the
    job's PreemptTime is set), the job is requeued now, whatever its status. Slurm would
    count a run that ends within its grace as COMPLETED or FAILED, never to run again: a
    job that checkpointed and exited would lose the rest of its work. Its end is not
    written (it did not end). Told before its walltime, or by job_control, it ends as it
    ends."""
    return ['if [ -n "$corral_notice" ] && scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q " PreemptTime=[0-9]"; '
            "then",
            f'  echo "corral: preempted (sent {name}); the job ended within its grace, so it is requeued now" >&2',
            '  scontrol requeue "$SLURM_JOB_ID" >/dev/null 2>&1',
            "  while :; do sleep 1; done  # until Slurm ends this run (the requeue, else the grace's end)",
            "fi"]
