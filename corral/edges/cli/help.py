"""`corral --help` in sections, as gh, kubectl and uv list theirs, without importing the
commands that are loaded only when called (corral/edges/cli/main.py ``LAZY``): their one-line
summaries are here, so the top-level help starts no Cedar, polars or tree-sitter.
tests/test_cli_help.py fails when a command is in no section, a summary here differs
from the command's own, or a command's help shows no example."""

from __future__ import annotations

SECTIONS: list[tuple[str, list[str]]] = [
    ("Jobs", ["submit", "status", "wait", "logs", "cancel", "jobs", "control", "usage", "plan", "facility", "whoami"]),
    ("Memory", ["remember", "recall", "advice"]),
    ("Storage", ["env", "workspace"]),
    ("Agent tools", ["agent", "mcp", "risk"]),
    ("Sponsors", ["login", "dashboard", "sponsor", "approvals", "notify"]),
    ("Admin", ["serve", "doctor", "saved", "backup", "restore", "migrate", "config", "principal", "token", "policy", "audit", "sandbox", "slurm"]),
    ("Analysis (offline, no gateway)", ["analyze", "synth", "simulate"]),
]
"""Every command, once, in the order a reader meets them; a command made from a verb's
declaration is added to the section it declares (corral/edges/cli/generated.py)."""


def _declared() -> None:
    from corral.edges import verbs  # noqa: F401  # the declarations register themselves
    from corral.edges.declare import DECLARED

    where = dict(SECTIONS)
    for verb in DECLARED:
        if verb.cli is not None and verb.cli.generated and verb.cli.name not in where[verb.cli.section]:
            where[verb.cli.section].append(verb.cli.name)


_declared()

SUMMARIES: dict[str, str] = {
    "advice": "What corral remembers of a job like this one, without submitting it.",
    "agent": "Run coding agents as corral agent sessions.",
    "analyze": "Measure what agents take of a facility, from its accounting data.",
    "approvals": "Approve or decline what your agents asked to do where the facility's policy says a person must answer first (a rule with @ask(\"sponsor\")).",
    "audit": "The audit chain: every decision (submit, cancel), allowed or refused, tamper-evident.",
    "backup": "Back up a gateway's state (store, keys, identities, audit) while it serves.",
    "config": "The configuration: every key's reference, and a check of a corral.toml.",
    "control": "Hold, release, requeue or signal a job, where its lane can.",
    "dashboard": "Print a one-time link that signs your browser in to the dashboard as you.",
    "doctor": "Check this host before serving: Slurm, accounting, job_submit.lua, munge, the clock, preemption, bubblewrap, user namespaces, seccomp, the dynamic uid range, principals' Unix users in NSS, the store, free disk, TLS.",
    "env": "Environment images: a Python environment built once with uv, packed into one read-only squashfs file, shared by every job and every principal.",
    "policy": "The facility policy (Cedar): what each principal may do, and why not.",
    "principal": "Register and list principals: humans, agents (with a sponsor) and services.",
    "notify": "Be told when your agents' jobs end, their budgets run low or the policy refuses them.",
    "plan": "What submitting this job would do, without submitting it: the verdict, its lane, and at a facility of several clusters every cluster and partition ranked (Slurm's start estimate, the SUs, and why one does not fit).",
    "login": "Sign in as yourself, without an admin: your Unix user proves who you are.",
    "migrate": "Bring the store's schema up to this corral's; --check says what would run.",
    "recall": "Search the notes you may read, best match first: by their words and by their meaning, so a question finds a note worded otherwise.",
    "remember": "Write a note for later sessions: a fix, a pitfall, what works here.",
    "restore": "Restore a backup onto a fresh home, its audit chain verified first.",
    "risk": "Tag shell commands by what they risk, and give the policy's decision for an agent.",
    "saved": "What corral saved the scheduler: the calls its clients would have made without it against those it made.",
    "sandbox": "Show the facility's job sandbox, or try a command inside it.",
    "simulate": "Simulate a facility with agents as ordinary users, through corral, and banned.",
    "slurm": "Slurm-side pieces of corral.",
    "sponsor": "What the agents you answer for ran, used and were refused, and what waits for you.",
    "synth": "Write a synthetic facility: a sacct export of human and agent users, with labels.",
    "token": "Mint, narrow, list and revoke tokens, and see what each used.",
    "usage": "What a finished job used against what it asked (elapsed, CPU time, peak memory, efficiencies, as seff reports them), and what to ask next time.",
    "workspace": "Copy-on-write trial workspaces: fork a project, let jobs change it, then look at the diff and commit it back, or discard it.",
}
"""The first sentence of each lazily loaded command's help, as its module writes it."""
