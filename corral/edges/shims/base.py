"""What every Slurm command shim shares: the gateway client from the agent's
environment, Slurm's words for corral's states, Slurm's time formats, and errors
worded as Slurm's own (``sbatch: error: ...``, exit 1), or, for what a shim cannot
honour, an error that names the flag (exit 2 is argparse's; Slurm's is 1 and we keep it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pwd
import sys
import time
from typing import Any, NoReturn

from corral.edges.client import Client, GatewayUnreachable
from corral.core.errors import CorralError
from corral.core.slurm_formats import format_limit
from corral.edges import reads

SHORT = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA",
         "TIMEOUT": "TO", "OUT_OF_MEMORY": "OOM", "UNKNOWN": "NF"}
"""squeue's %t codes for corral's JobState values (which are Slurm's long names)."""
ACTIVE = ("PENDING", "RUNNING")
OPEN_FAILED = 53
"""Slurm 22.05's ExitCode for a job whose output file cannot be opened: FAILED 0:53. The
sbatch shim's job exits with it (a signal would not survive the job sandbox's layers)."""


class ShimError(Exception):
    """Printed as ``PROG: error: MESSAGE`` and exit 1, as Slurm's commands do."""

    def __init__(self, message: str, code: int = 1, bare: bool = False) -> None:
        super().__init__(message)
        self.message, self.code, self.bare = message, code, bare


class Parser(argparse.ArgumentParser):
    """argparse that fails as Slurm's getopt does: ``PROG: unrecognized option '--x'``;
    help is ``--help`` alone (``-h`` is squeue's and sinfo's --noheader)."""

    def __init__(self, prog: str, allow_abbrev: bool = True, code: int = 1) -> None:
        super().__init__(prog=prog, add_help=False, allow_abbrev=allow_abbrev,
                         description=f"corral's {prog}: Slurm's {prog} served by the corral gateway.")
        self.add_argument("--help", action="help", help="show this help and exit")
        self.code = code
        """What Slurm's command exits with on a bad option (sbatch and srun: 255)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            flag = message.split(": ", 1)[1].split()[0]
            from corral.edges.shims.known import is_known

            if is_known(self.prog, flag):  # Slurm has it; corral does not serve it (yet): say so by name
                raise ShimError(f"corral's {self.prog} does not support {flag.split('=', 1)[0]} yet: it is "
                                "Slurm's, but corral does not act on it (drop it)")
            raise ShimError(f"{self.prog}: unrecognized option '{flag}'\nTry \"{self.prog} --help\" for more "
                            "information", self.code, bare=True)
        raise ShimError(f"{self.prog}: {message}\nTry \"{self.prog} --help\" for more information", self.code,
                        bare=True)


def unsupported(prog: str, flag: str, why: str = "") -> NoReturn:
    """``why`` says what corral does instead, or what to do: no corral command or tool is
    promised where none takes the option (sbatch --account: none does, issue 49)."""
    raise ShimError(f"corral's {prog} does not support {flag}: " + (why or "drop it"))


@functools.lru_cache(maxsize=1)
def client() -> Client:
    """The gateway, one keep-alive connection for the whole command (a shim is one process)."""
    url = os.environ.get("CORRAL_URL") or "http://127.0.0.1:8765"
    token = os.environ.get("CORRAL_TOKEN")
    if not token:
        from corral.edges.client import default_token

        token = default_token(url=url)
    return Client(url, token, os.environ.get("CORRAL_SESSION"), timeout=60)


FACILITY_TTL_S = 30.0


@functools.lru_cache(maxsize=1)
def facility(c: Client) -> dict[str, Any]:
    """The facility's partitions: asked once per command, and once per 30 s per agent
    session (``corral agent run`` gives each session a cache directory): an agent's
    ``squeue`` loop then costs the gateway one job lookup per call."""
    cache = os.environ.get("CORRAL_SHIM_CACHE")
    path = os.path.join(cache, "facility.json") if cache else None
    if path:
        try:
            if time.time() - os.stat(path).st_mtime < FACILITY_TTL_S:
                with open(path) as f:
                    return dict(json.load(f))
        except (OSError, ValueError):
            pass
    info = c.run(reads.facility)
    if path:
        tmp = f"{path}.{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump({"partitions": info.get("partitions") or []}, f)
            os.replace(tmp, path)
        except OSError:
            pass
    return info


def wait(c: Client, job_id: int) -> dict[str, Any]:
    """Until the job ends, in the gateway's bounded long-polls."""
    while True:
        done = c.run(reads.wait, job_id, 590.0)
        if done.get("state") not in ACTIVE:
            return done


def user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def elapsed(job: dict[str, Any], now: float | None = None) -> float:
    """How long a job has run (or ran): to its end, else to ``now``."""
    start = job.get("start_time")
    if not start:
        return 0.0
    end = job.get("end_time") or (now if now is not None else time.time())
    return max(0.0, end - start)


def squeue_time(s: float) -> str:
    """squeue's %M: M:SS, H:MM:SS, D-HH:MM:SS (the form of a limit, %l)."""
    return format_limit(s)


def hms(s: float) -> str:
    """sacct's and scontrol's time: HH:MM:SS, or D-HH:MM:SS."""
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h:02d}:{m:02d}:{sec:02d}"


def limit(s: float) -> str:
    """A time limit as sinfo and squeue %l print it (1:00:00, 2-00:00:00, 5:00)."""
    return squeue_time(s)


def stamp(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"


def exit_code(job: dict[str, Any]) -> str:
    """sacct's ExitCode: CODE:SIGNAL."""
    code = job.get("exit_code")
    if code is None:
        return "0:0"
    if code > 128 and job.get("state") in ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"):
        return f"0:{code - 128}"
    if code in (OPEN_FAILED, 128 + OPEN_FAILED) and job.get("state") == "FAILED" and \
            "slurm_stdout" in ((job.get("spec") or {}).get("labels") or {}):
        return f"0:{OPEN_FAILED}"  # sbatch's shim: the output file could not be opened, as Slurm reports it
    if 128 < code <= 128 + 64 and job.get("state") == "FAILED":
        # Killed by a signal: Slurm's CODE:SIGNAL is 0:9 for a batch script killed by KILL. The
        # job's shells between Slurm and the work turn that into exit 137; read back, as a
        # shell would. (A script's own `exit 137` reads so too, which Slurm shows as 137:0.)
        return f"0:{code - 128}"
    return f"{code}:0"


def run(prog: str, fn: Any, argv: list[str]) -> int:
    """Run one shim; Slurm's wording on every failure, never a traceback."""
    try:
        return int(fn(argv) or 0)
    except ShimError as e:
        print(e.message if e.bare else f"{prog}: error: {e.message}", file=sys.stderr)
        return e.code
    except GatewayUnreachable as e:
        print(f"{prog}: error: Unable to contact slurm controller (connect failure): {e.message}", file=sys.stderr)
        return 1
    except CorralError as e:
        print(f"{prog}: error: {e.message}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a shim never shows an agent a traceback  # noqa: BLE001
        print(f"{prog}: error: {type(e).__name__}: {e} (corral's {prog}; report it to your admins)",
              file=sys.stderr)
        return 1
