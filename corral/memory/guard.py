"""What must not go into memory as given: secrets are redacted, suspected prompt
injection is flagged (and handed back to agents marked as untrusted data).

Offline, pattern-based, no model. A first line of defence for notes; the facility-wide
guard on everything agents read is the safety issue's work.
"""

from __future__ import annotations

import re

SECRETS: list[tuple[str, re.Pattern[str]]] = [
    ("private_key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")),
    ("aws_access_key", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b")),
    ("openai_key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}\b")),
    ("anthropic_key", re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}\b")),
    ("slack_token", re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}\b")),
    ("corral_token", re.compile(r"\bcrl_[A-Za-z0-9]+_[A-Za-z0-9_-]{16,}\b")),
    ("password_in_url", re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)")),
    ("assigned_secret", re.compile(r"(?i)\b(?:api[_-]?key|secret|token|passw(?:or)?d)\b\s*[:=]\s*['\"]?([^\s'\"]{8,})")),
]

INJECTION = re.compile(
    r"(?i)(ignore|disregard|forget)\s+(all\s+|any\s+|the\s+)?(previous|prior|above|earlier)\s+(instructions|rules|prompts?)"
    r"|you\s+are\s+now\s+(a|an|in)\b|new\s+system\s+prompt|<\|im_start\|>|\[/?INST\]"
    r"|(reveal|print|send|exfiltrate)\s+(your|the)\s+(system\s+prompt|api\s+key|token|credentials)")


def redact(text: str) -> tuple[str, list[str]]:
    """-> (text with secrets replaced, names of what was found)."""
    found: list[str] = []
    for name, pattern in SECRETS:
        if pattern.search(text):
            found.append(name)
            if name == "assigned_secret":
                text = pattern.sub(lambda m: m.group(0).replace(m.group(1), "[REDACTED]"), text)
            else:
                text = pattern.sub("[REDACTED]", text)
    return text, found


def suspicious(text: str) -> bool:
    return bool(INJECTION.search(text))
