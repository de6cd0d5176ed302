"""The signals a job may be sent, by name: apart from corral/gateway/job_control.py so that the
CLI's `corral control --help` lists them without importing the service's core."""

SIGNALS = ("HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "CONT", "STOP", "TSTP", "KILL")
"""Signals a job may be sent: the ones programs handle (checkpoint on USR1, ...)."""

NOTICE_SIGNALS = ("USR1", "USR2", "HUP", "INT", "QUIT")
"""What a job may ask to be sent before its end (``signal``: Slurm's ``--signal``): the
ones a batch shell passes on (TERM and KILL are Slurm's own end)."""
NOTICE_DEFAULT_S = 60
"""Slurm's own: ``--signal=USR1`` without ``@N`` is sent 60 s before the end."""
GRACE_S = 120
"""The preemption grace corral gives agents' opportunistic work on Slurm (decision 0058):
the seconds between the notice and Slurm's TERM and requeue, the QOS's GraceTime
(scripts/slurm-up sets it; a site sets its own to this)."""
DEFAULT_NOTICE = f"USR1@{GRACE_S}"
"""What an opportunistic job that chose no ``signal`` gets, passed on only to a job that
handles it: one that does not runs on to Slurm's TERM as before (a USR1 it does not
handle would kill it at once, and 120 s before its walltime too)."""
_NUMBERS = {"1": "HUP", "2": "INT", "3": "QUIT", "10": "USR1", "12": "USR2"}


def parse_notice(value: object) -> str | None:
    """A job's ``signal`` as Slurm's ``--signal`` takes it (``[B:]SIG[@SECONDS]``, SIG a
    name with or without SIG, or its number) -> 'NAME@SECONDS'; ValueError in words. The
    ``B:`` is corral's always: its batch shell takes the signal and passes it into the
    job (its command or script), as Slurm's batch shell would to a script."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("signal is a string such as 'USR1@120' (Slurm's --signal)")
    text = value.strip().upper()
    if text.startswith("R:"):
        raise ValueError("signal: 'R:' (overlap a reservation) is not corral's to give; use e.g. 'USR1@120'")
    sig, _, at = text.removeprefix("B:").partition("@")
    name = _NUMBERS.get(sig, sig.removeprefix("SIG"))
    if name not in NOTICE_SIGNALS:
        raise ValueError(f"signal {value[:40]!r}: a job may be sent one of {', '.join(NOTICE_SIGNALS)} before its "
                         "end, e.g. 'USR1@120'")
    if at and not (at.isdigit() and int(at) <= 65535):
        raise ValueError(f"signal {value[:40]!r}: the seconds after @ are a whole number from 0 to 65535")
    return f"{name}@{int(at) if at else NOTICE_DEFAULT_S}"


def notice_parts(text: str) -> tuple[str, int]:
    """'USR1@120' (parse_notice's) -> ('USR1', 120)."""
    name, _, at = text.partition("@")
    return name, int(at)
