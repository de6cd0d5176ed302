"""The guard on what corral hands an agent from an untrusted source (job output, other
principals' notes, advice drawn from job output): secrets are redacted, suspected
prompt injection is flagged and wrapped as untrusted data, and the reading session is
tainted (corral/safety/gate.py), so the policy can narrow what it does next.

Secrets are found by detect-secrets' plugins and corral's rules (corral/safety/secrets.py);
injection by the patterns here. Job output is guarded whole, as it grows, by
corral/safety/output_guard.py, which uses both. Offline: no model to download. Text is normalized first (NFKC, no
zero-width or bidi-control characters, Unicode 'tag' characters decoded), so the usual
tricks of hiding words from a regex do not hide them from this one; base64 runs are
decoded and scanned too.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import unicodedata
from dataclasses import dataclass, field

from corral.safety import secrets

_INJECTION: list[tuple[str, str]] = [
    ("override", r"\b(ignore|disregard|forget|override|bypass)\b[\w\s,'-]{0,40}?\b(previous|prior|above|earlier|"
                 r"preceding|all|any|your|the)\b[\w\s,'-]{0,25}?\b(instructions?|rules|prompts?|guidelines|directions|"
                 r"guardrails|polic(y|ies)|safety)"),
    ("role_reassignment", r"\byou\s+are\s+(now\s+(a|an|in|the|my|free|unrestricted|jailbroken|dan)\b|no\s+longer\b)|\bfrom\s+now\s+on,?\s+you\b|\bact\s+as\s+(an?\s+)?"
                          r"(unrestricted|jailbroken|developer\s+mode|dan)\b|\bdeveloper\s+mode\s+(enabled|on)\b"),
    ("fake_system", r"\bnew\s+system\s+prompt\b|\b(system|assistant|developer)\s*:\s*(you\b|your\b|the\s+user\b|"
                    r"i\s+will\b|sure\b|new\s|ignore\b|from\s+now\b)|<\|(im_start|im_end|system|endoftext)\|>"
                    r"|\[/?(INST|SYS)\]|<<\s*SYS\s*>>|</?\s*(system|tool_call|function_calls|invoke|antml)\b"),
    ("exfiltrate", r"\b(reveal|print|show|send|post|upload|exfiltrate|leak|email)\b[\w\s]{0,30}?\b(system\s+prompt|"
                   r"api[\s_-]?keys?|tokens?|credentials|secrets?|passwords?|ssh\s+keys?|env(ironment)?\s+variables)"),
    ("imperative_to_agent", r"\b(ai|llm|assistant|agent|claude|codex|copilot)\b[\w\s,:;-]{0,30}?\b(must|should|needs?\s+to)\s+"
                            r"(now\s+)?(run|execute|delete|remove|curl|download|disable|ignore|submit)\b"),
    ("hidden_instruction", r"\b(do\s+not|don't)\s+(tell|inform|mention\s+(this\s+)?to)\s+the\s+(user|human|operator)\b"
                           r"|\bwithout\s+(telling|asking|informing)\s+the\s+(user|human)\b"),
    ("pipe_to_shell", r"\b(curl|wget)\b[^\n|]{0,200}\|\s*(sudo\s+)?(ba|z)?sh\b"),
]
INJECTION = [(name, re.compile(rx, re.I | re.M)) for name, rx in _INJECTION]
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\u00ad]")
_TAGS = re.compile("[\U000e0000-\U000e007f]+")
_B64 = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")


def normalize(text: str) -> str:
    """What a model would read: compatibility forms folded, invisible characters dropped,
    Unicode tag characters (an invisible copy of ASCII) spelled out."""
    text = _TAGS.sub(lambda m: " " + "".join(chr(ord(c) - 0xE0000) for c in m.group(0)) + " ", text)
    return unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))


def redact(text: str) -> tuple[str, list[str]]:
    """-> (text with secrets replaced, names of what was found): corral/safety/secrets.py."""
    return secrets.redact(text)


def injection(text: str) -> list[str]:
    """The kinds of injection pattern found (empty: none)."""
    seen = normalize(text)
    kinds = [name for name, rx in INJECTION if rx.search(seen)]
    if not kinds:
        for blob in _B64.findall(seen)[:20]:
            try:
                decoded = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                continue
            kinds += [f"base64:{name}" for name, rx in INJECTION if rx.search(decoded)]
    return kinds


def suspicious(text: str) -> bool:
    return bool(injection(text))


@dataclass
class Scan:
    text: str
    secrets: list[str] = field(default_factory=list)
    injection: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.injection)

    def report(self) -> dict[str, list[str]]:
        return {"redacted": self.secrets, "suspected_injection": self.injection}


def delimit(text: str, source: str, kinds: list[str] | None = None) -> str:
    """``text`` marked as data from ``source``, not instructions (and what was suspected in
    it), between tags carrying a random nonce made for this answer: the data cannot close
    them, whatever variant of a closing tag it holds, since it cannot know the nonce (and a
    nonce the data happens to contain is drawn again)."""
    flag = f" suspected-injection={','.join(kinds)!r}" if kinds else ""
    while True:
        nonce = os.urandom(6).hex()
        if nonce not in text and nonce not in source:
            break
    return f"<untrusted-data-{nonce} source={source!r}{flag}>\n{text}\n</untrusted-data-{nonce}>"


def scan(text: str, source: str) -> Scan:
    """Redact secrets; when injection is suspected, wrap the text as untrusted data."""
    clean, found = redact(text)
    kinds = injection(clean)
    if kinds:
        clean = delimit(clean, source, kinds)
    return Scan(clean, found, kinds)


_DELIMITED = re.compile(r"<untrusted-data-([0-9a-f]{12}) source='([^']*)'(?: suspected-injection='([^']*)')?>\n?"
                        r"(.*?)(?:\n?</untrusted-data-\1>|$)", re.S)
_OPEN_CUT = re.compile(r"<untrusted-data-[0-9a-f]{0,12}[^>]*$")


def for_people(text: str) -> str:
    """``text`` as a person reads it: each delimited block (see ``delimit``) shown as a
    quotation naming its source, and any flag, instead of the tags a model needs; a
    block cut short (a reason truncated in the audit log) is shown as far as it goes.
    Only for people's eyes: what a model reads keeps the tags."""

    def quoted(m: re.Match[str]) -> str:
        flag = f"; suspected injection: {m.group(3)}" if m.group(3) else ""
        body = m.group(4)
        if not m.group(0).endswith(f"</untrusted-data-{m.group(1)}>"):  # cut short: so is its closing tag
            cut = body.rfind("<")
            if cut >= 0 and f"</untrusted-data-{m.group(1)}>".startswith(body[cut:]):
                body = body[:cut]
            body = body.rstrip() + "\u2026"
        return f"\u201c{body.strip()}\u201d (from {m.group(2)}{flag})"

    return _OPEN_CUT.sub("\u2026", _DELIMITED.sub(quoted, text))
