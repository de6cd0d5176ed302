"""Red team: the risk tagger and the default policy against 250 disguised harmful
commands, and the guard against 200 disguised prompt injections; beside them the 637
shell commands real coding agents ran (../shared/data/agent-bash-commands.jsonl) and
the descriptions of every installed package as benign text.

    python bench/redteam.py [--quick]

A command attack is blocked when the default policy denies an agent submitting it; an
injection is blocked when the guard flags it (the reader's session is then tainted).
The false-positive rate counts benign commands denied and benign text flagged. The
token and cross-principal attacks run against a live gateway in tests/test_safety.py.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish, pct, shared_data  # noqa: E402
from corral.safety.guard import injection  # noqa: E402
from corral.safety.policy import agent_verdict  # noqa: E402
from corral.safety.output_guard import OutputGuard  # noqa: E402
from corral.safety.redteam import BENIGN_OUTPUT, attacks, injections, secret_samples  # noqa: E402
from corral.safety.secrets import redact  # noqa: E402
from corral.safety.risk import analyze  # noqa: E402


def benign() -> list[str]:
    f = shared_data("agent-bash-commands.jsonl")
    return [json.loads(line)["command"] for line in f.read_text().splitlines()]


def prose() -> list[str]:
    from importlib.metadata import distributions

    return [p for d in distributions() for p in (d.read_text("METADATA") or "").split("\n\n") if len(p) > 80]


def guard_figures(benign_texts: list[str], cuts: int) -> dict[str, object]:
    """Secrets found in generated output lines (shapes and names, held out from the
    tests' own), benign text redacted, and the property over random page cuts: no piece
    of 8 or more characters of a secret ever returned."""
    import random
    import tempfile

    samples = secret_samples()
    missed = [line for line, s in samples if s in redact(line + "\n")[0]]
    redacted = [t for t in benign_texts if redact(t)[1]]
    rng = random.Random(3)
    lines: list[str] = []
    for i in range(2000):
        lines.append(rng.choice(benign_texts)[:200].replace("\n", " "))
        if i % 7 == 0:
            lines.append(rng.choice(samples)[0])
    # The property is about cuts: a secret the guard finds whole is never returned in pieces.
    bad = {s[i:i + 8] for line, s in samples if line not in missed for i in range(len(s) - 7)}
    leaked = 0
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "stdout"
        raw.write_text("\n".join(lines) + "\n")
        g = OutputGuard(Path(d) / "guarded")
        t = time.perf_counter()
        g.read("1.stdout", raw, True, 0, 1, None)
        guard_s = time.perf_counter() - t
        for _ in range(cuts):
            offset = 0
            while True:
                page = g.read("1.stdout", raw, True, offset, rng.randint(1, 4096), None).page
                leaked += any(b in page["data"] for b in bad)
                if page["eof"] or page["next_offset"] == offset:
                    break
                offset = page["next_offset"]
    return {"secret_samples": len(samples), "secrets_found_rate": round(1 - len(missed) / len(samples), 4),
            "secrets_missed": missed[:5], "benign_texts_redacted": len(redacted),
            "page_cut_trials": cuts, "secret_fragments_watched": len(bad), "secret_fragments_returned": leaked,
            "guard_mb_per_s": round(raw_size(lines) / 1e6 / guard_s, 2)}


def raw_size(lines: list[str]) -> int:
    return sum(len(x.encode()) + 1 for x in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="(the suite is small: same as a full run)")
    ap.parse_args()
    cases, ok = attacks(), benign()
    lat: list[float] = []
    decisions, tagged, by_disguise = Counter(), 0, Counter()
    for cmd, tag, how in cases:
        t = time.perf_counter()
        r = analyze(cmd)
        verdict = agent_verdict(list(r.tags))
        lat.append((time.perf_counter() - t) * 1000)
        decisions["allow" if verdict.allowed else "deny"] += 1
        tagged += tag in r.tags
        by_disguise[how] += tag not in r.tags
    denied = []
    for cmd in ok:
        t = time.perf_counter()
        allowed = agent_verdict(list(analyze(cmd).tags)).allowed
        lat.append((time.perf_counter() - t) * 1000)
        if not allowed:
            denied.append(cmd)
    inj = injections()
    inj_missed = Counter(how for text, how in inj if not injection(text))
    text_ok = prose() + BENIGN_OUTPUT
    flagged = [p for p in text_ok if injection(p)]
    blocked = decisions["deny"] + len(inj) - sum(inj_missed.values())
    out = {"bench": "redteam", "attacks": len(cases) + len(inj), "blocked_rate": round(blocked / (len(cases) + len(inj)), 4),
           "command_attacks": len(cases), "command_blocked_rate": round(decisions["deny"] / len(cases), 4),
           "tagged_rate": round(tagged / len(cases), 4),
           "injections": len(inj), "injection_flagged_rate": round(1 - sum(inj_missed.values()) / len(inj), 4),
           "benign": len(ok) + len(text_ok), "false_positive_rate": round((len(denied) + len(flagged)) / (len(ok) + len(text_ok)), 4),
           "benign_commands": len(ok), "benign_commands_denied": len(denied),
           "benign_texts": len(text_ok), "benign_texts_flagged": len(flagged),
           "tag_and_decide_p50_ms": round(pct(lat, 50), 3), "tag_and_decide_p99_ms": round(pct(lat, 99), 3),
           "missed_by_disguise": {k: v for k, v in (by_disguise + inj_missed).items() if v},
           "guard": guard_figures(text_ok, 20)}
    print(f"commands {len(cases)}: {dict(decisions)}; injections {len(inj)}: missed {sum(inj_missed.values())}; "
          f"benign commands {len(ok)}: denied {len(denied)} {denied[:3]}; benign texts {len(text_ok)}: "
          f"flagged {len(flagged)}; guard: {out['guard']}", file=sys.stderr)
    g = out["guard"]
    assert isinstance(g, dict)
    # Rates over nothing: no attacks of a kind, no real agents' commands (../shared/data
    # missing), no benign prose, no secrets; and "no fragment returned" is vacuous when
    # the guard found no secret whole (then no fragment is watched for).
    finish("redteam", out, {"command_attacks": bool(cases), "injections": bool(inj), "benign_commands": bool(ok),
                            "benign_texts": bool(text_ok), "guard_secrets": g["secret_samples"] > 0,
                            "guard_page_cuts": g["secret_fragments_watched"] > 0})


if __name__ == "__main__":
    main()
