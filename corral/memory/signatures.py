"""Why a job failed, in one word an agent can act on: error signatures read from the
tail of its output and its final state.

Each signature says whether it is *deterministic*: the same script with the same
resources will fail the same way again (a missing module, a command not found, out
of memory at the same limit). Those are the failures agents repeat across sessions,
and the only ones corral will refuse to rerun unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    name: str
    detail: str
    deterministic: bool
    hint: str

    def describe(self) -> str:
        return f"{self.name}: {self.detail}" if self.detail else self.name


# (name, pattern on the output tail, deterministic, what to do). First match wins; the
# patterns are specific before general (CUDA's out of memory before the host's).
PATTERNS: list[tuple[str, re.Pattern[str], bool, str]] = [
    ("cuda_out_of_memory", re.compile(r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation"),
     True, "use a smaller batch or model, or a GPU with more memory"),
    ("module_not_found", re.compile(r"ModuleNotFoundError: No module named '([^']+)'"),
     True, "install the module in the job's environment (or load its module) before running"),
    ("import_error", re.compile(r"ImportError: (.{0,120})"), True, "fix the environment: a library or version is missing"),
    ("command_not_found", re.compile(r"(?:^|\n)(?:[^\n]*: )?(?:line \d+: )?([\w.+-]+): command not found"),
     True, "load the module that provides it (module avail / module load) or use its full path"),
    ("no_such_file", re.compile(r"(?:can't open file|No such file or directory)[^\n]{0,160}"),
     True, "check the path: it does not exist where the job runs (use an absolute path or set workdir)"),
    ("permission_denied", re.compile(r"Permission denied[^\n]{0,120}"), True,
     "the job's user may not read or write that path; pick a directory you own"),
    ("syntax_error", re.compile(r"SyntaxError: (.{0,120})"), True, "fix the syntax error before resubmitting"),
    ("disk_quota", re.compile(r"Disk quota exceeded|No space left on device"), False,
     "free space or write to scratch; check quotas"),
    ("segfault", re.compile(r"Segmentation fault|SIGSEGV|core dumped"), True,
     "a crash in native code: check inputs and library versions; debug before rerunning"),
    ("python_exception", re.compile(r"Traceback \(most recent call last\):[\s\S]*?\n(\w+(?:Error|Exception): .{0,120})"),
     True, "fix the exception shown before resubmitting"),
]

STATE_SIGNATURES: dict[str, tuple[str, bool, str]] = {
    "OUT_OF_MEMORY": ("out_of_memory", True, "ask for more memory (the job used more than it asked for)"),
    "TIMEOUT": ("timeout", False, "ask for a longer walltime, or make the job do less per run"),
}


def extract(state: str, exit_code: int | None, text: str) -> Signature | None:
    """The signature of a failed job (None for success or an unexplained failure)."""
    if state == "COMPLETED":
        return None
    tail = text[-16_384:]
    for name, pattern, deterministic, hint in PATTERNS:
        m = pattern.search(tail)
        if m:
            detail = (m.group(1) if m.groups() else m.group(0)).strip()[:160]
            if name == "python_exception" and "out of memory" in detail.lower():
                continue
            return Signature(name, detail, deterministic, hint)
    if state in STATE_SIGNATURES:
        name, deterministic, hint = STATE_SIGNATURES[state]
        return Signature(name, "", deterministic, hint)
    if exit_code in (137,) and state == "FAILED":
        return Signature("killed", "exit code 137 (SIGKILL)", False, "often memory: ask for more, or check the node")
    return None
