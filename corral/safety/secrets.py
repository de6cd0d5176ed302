"""Secrets in text: found, then replaced by ``[REDACTED]``.

Detection is Yelp's ``detect-secrets`` (its provider plugins: AWS, Azure, GitHub,
GitLab, npm, PyPI, Stripe, Slack, Discord, Twilio, SendGrid, JWTs, private keys...;
its keyword detector; its base64 and hex entropy detectors with their default limits
and its false-positive filters), plus corral's own rules for what it misses in job
output: ``NAME=value`` assignments whose name says secret (``aws_secret_access_key``,
``WANDB_API_KEY``, ``NPM_TOKEN``...), tokens of ML platforms and corral's own tokens.

A private-key block is redacted to its END line, or to ``KEY_BLOCK_MAX`` characters
when it has none: never to the end of the output.

Cost is linear in the text: corral's rules see every line, the plugins only lines that
hold a candidate (a word such as key, secret, token, pass, auth, or a run of 20 token
characters mixing upper case, lower case and digits), and a long line is read in
overlapping windows of ``MAX_LINE`` characters, only those that hold a candidate. Measured: ~0.12 s per MB of
training log, where every line through the plugins cost ~2.8 s.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import re
from typing import Any

KEY_BLOCK_MAX = 8192
"""Longest private-key block (an RSA 8192-bit key in PEM is ~6.5 KB)."""
MAX_LINE = 16384
OVERLAP = 1024
"""A line longer than MAX_LINE is read in windows of it that overlap by this much."""
REDACTED = "[REDACTED]"

BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----")
END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----")
KEYWORDS = ("key", "secret", "token", "pass", "pwd", "auth", "cred", "bearer", "jwt", "://")
_RUN = re.compile(r"[A-Za-z0-9+/=_-]{20,}")
_TOKEN_LEFT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_~.-")
_TOKEN_RIGHT = _TOKEN_LEFT | {"="}

_TOKENS = [
    ("anthropic_key", r"sk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai_key", r"sk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{20,}"),
    ("google_api_key", r"AIza[0-9A-Za-z_-]{35}"),
    ("huggingface_token", r"hf_[A-Za-z0-9]{30,}"),
    ("npm_token", r"npm_[A-Za-z0-9]{36}\b"),
    ("databricks_token", r"dapi[0-9a-f]{32}\b"),
    ("replicate_token", r"r8_[A-Za-z0-9]{37}\b"),
    ("aws_access_key", r"(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("pypi_token", r"pypi-AgE[A-Za-z0-9_-]{50,}"),
    ("github_token", r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
    ("slack_token", r"xox[baprs]-[A-Za-z0-9-]{10,}"),
    ("corral_token", r"(?:crl_[A-Za-z0-9]+_[A-Za-z0-9_-]{16,}|crb_[A-Za-z0-9_=-]{40,})"),
]
TOKENS = re.compile(r"\b(?=[sAhndrgxcp])(?:" + "|".join(f"(?P<{n}>{rx})" for n, rx in _TOKENS) + ")")
"""Tokens known by their prefix, whole matches, in one pass over the text (the
lookahead on the first letters: 26 ms a MB, where one pattern each took 280)."""
LINE_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("bearer_header", re.compile(r"(?i)(?<=authorization: bearer )[A-Za-z0-9._~+/=-]{16,}")),
    ("password_in_url", re.compile(r"(?<=://)[^/\s:@]{1,200}:[^/\s@]{1,200}(?=@)")),
]
"""Whole matches, tried on candidate lines only."""
_WRAPPED = re.compile(r"(?<![A-Za-z0-9_+/=-])([A-Za-z0-9_+/=-]{4,}+)(\r?\n)([A-Za-z0-9_+/=-]{4,})")
"""A run of token characters at a line's end and another at the next line's start: a
token wrapped over two lines (a terminal's width, a log's column limit). Tried only
where a run begins, and the run taken whole (possessive): without both, each position
inside a run scanned to its end again, quadratic in the run: 2.6 s for 20 KB of one
letter, 255 s for 200 KB, with the GIL held, so a job's long line stalled every caller
of the gateway while its agent read it (tests/test_output_guard.py)."""
_B64 = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/]{24,}={0,2}(?![A-Za-z0-9+/=_-])")
ASSIGNED = re.compile(
    r"(?i)(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]{0,40}(?:key|secret|token|passw(?:or)?d|passwd|pwd|credentials?|jwt)"
    r"[\"']?\s{0,3}[:=]\s{0,3}[\"']?([^\s\"',;]{8,})")
"""A name that ends in what it holds (``aws_secret_access_key``, ``NPM_TOKEN``), then a
value that looks made, not written: letters and digits, or long and varied."""


_KIND = {"JSON Web Token": "jwt", "AWS Access Key": "aws_access_key", "GitHub Token": "github_token",
         "Private Key": "private_key", "Slack Token": "slack_token", "OpenAI Token": "openai_key"}
"""detect-secrets' names where corral had its own before."""


@functools.lru_cache(maxsize=1)
def _plugins() -> list[Any]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    # Not the IPv4 plugin: addresses fill job output and are not credentials.
    mapping: dict[str, Any] = dict(get_mapping_from_secret_type_to_class())
    return [mapping[name]() for name in sorted(mapping) if name != "Public IP (ipv4)"]


def _filtered(secret: str, line: str) -> bool:
    """detect-secrets' own heuristics for what only looks like a secret."""
    from detect_secrets.filters import heuristic as h

    return (h.is_sequential_string(secret) or h.is_potential_uuid(secret) or h.is_templated_secret(secret)
            or h.is_prefixed_with_dollar_sign(secret) or h.is_indirect_reference(line)
            or h.is_likely_id_string(secret, line) or h.is_not_alphanumeric_string(secret))


def _made(value: str) -> bool:
    if value.startswith(("$", "%", "{", "<", "*", "/", "~", ".")) or "(" in value:
        return False  # a reference, a path or a call, not a value
    letters, digits = any(c.isalpha() for c in value), any(c.isdigit() for c in value)
    return (letters and digits) or (len(value) >= 20 and len(set(value)) >= 12)


def _mixed(run: str) -> bool:
    return any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)


def _found(line: str) -> list[tuple[str, str]]:
    """(kind, secret value) the assignment rule and the plugins find in a candidate line
    (or a window of one: at most MAX_LINE characters, no line end)."""
    found = [(name, m.group(0)) for name, rx in LINE_RULES for m in rx.finditer(line)]
    found += [("assigned_secret", m.group(1)) for m in ASSIGNED.finditer(line) if _made(m.group(1))]
    for plugin in _plugins():
        # The YAML spelling makes the keyword plugin take `key: value` and `key = value`.
        for s in plugin.analyze_line(filename="output.yaml", line=line, line_number=0):
            if s.secret_value and not _filtered(s.secret_value, line):
                found.append((_KIND.get(s.type) or re.sub(r"\W+", "_", s.type).strip("_").lower(), s.secret_value))
    return found


def _whole(line: str, value: str) -> list[tuple[int, int]]:
    """Where ``value`` occurs, each grown to the token it is part of (a plugin may report
    only a token's prefix)."""
    spans = []
    start = line.find(value)
    while start >= 0:
        a, b = start, start + len(value)
        while a > 0 and line[a - 1] in _TOKEN_LEFT:
            a -= 1
        while b < len(line) and line[b] in _TOKEN_RIGHT:
            b += 1
        spans.append((a, b))
        start = line.find(value, b)
    return spans


def _unwrap(text: str, kinds: list[str]) -> str:
    """A known token wrapped over two lines: both its parts redacted."""

    def fix(m: re.Match[str]) -> str:
        head, brk, tail = m.group(1), m.group(2), m.group(3)
        t = TOKENS.search(head + tail)
        if t is None or not t.start() < len(head) < t.end():
            return m.group(0)  # no token across the line end
        whole_line = m.string[m.end():m.end() + 1] in ("", "\n", "\r")
        if TOKENS.match(head, t.start()) and not whole_line:
            return m.group(0)  # a whole token on the first line, and words after it on the next
        kinds.append(t.lastgroup or "token")
        return head[:t.start()] + REDACTED + brk + REDACTED + tail[t.end() - len(head):]

    return _WRAPPED.sub(fix, text) if "\n" in text else text


def _encoded(text: str, kinds: list[str]) -> str:
    """A base64 run that decodes to text holding a known token or a secret assignment:
    redacted whole."""

    def fix(m: re.Match[str]) -> str:
        run = m.group(0)
        if not _mixed(run):
            return run
        try:
            decoded = base64.b64decode(run + "=" * (-len(run) % 4), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return run
        t = TOKENS.search(decoded)
        a = None if t else next((x for x in ASSIGNED.finditer(decoded) if _made(x.group(1))), None)
        if t is None and a is None:
            return run
        kinds.append("base64:" + ((t.lastgroup or "token") if t else "assigned_secret"))
        return REDACTED

    return _B64.sub(fix, text)


def _redact_lines(text: str) -> tuple[str, list[str]]:
    """``text`` holds no private-key block: corral's rules over all of it at once, the
    plugins over its candidate lines only."""
    kinds: list[str] = []

    def token(m: re.Match[str]) -> str:
        kinds.append(m.lastgroup or "token")
        return REDACTED

    text = _encoded(_unwrap(text, kinds), kinds)
    text = TOKENS.sub(token, text)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    at: list[int] = []
    low = text.lower()
    for word in KEYWORDS:  # str.find: ten times faster than one case-blind pattern
        i = low.find(word)
        while i >= 0:
            at.append(i)
            i = low.find(word, i + len(word))
    at += [m.start() for m in _RUN.finditer(text) if _mixed(m.group(0))]
    hits: dict[int, set[int]] = {}  # line -> the windows of it that hold a candidate
    step = MAX_LINE - OVERLAP
    for i in at:
        n = bisect.bisect_right(starts, i) - 1
        off = i - starts[n]
        hits.setdefault(n, set()).update({off // step, max(0, off - OVERLAP) // step})
    for i in sorted(hits):
        line = lines[i]
        body = line.rstrip("\r\n")
        spans: set[tuple[int, int]] = set()
        # A long line is read in windows that overlap (a secret across a window's edge
        # is whole in the next), each only where a candidate is: linear in the line.
        for w in sorted(hits[i]):
            o = w * step
            piece = body[o:o + MAX_LINE]
            for kind, value in _found(piece):
                spans.update((a + o, b + o) for a, b in _whole(piece, value))
                kinds.append(kind)
        if spans:
            out, last = [], 0
            for a, b in sorted(spans):
                if a >= last:
                    out += [body[last:a], REDACTED]
                last = max(last, b)
            lines[i] = "".join(out) + body[last:] + line[len(body):]
    return "".join(lines), kinds


def key_block_end(text: str, begin: int) -> int:
    """Where a private-key block that starts at ``begin`` ends: after its END line, or
    at the end of the line that reaches ``KEY_BLOCK_MAX``."""
    end = END.search(text, begin, begin + KEY_BLOCK_MAX)
    if end:
        return end.end()
    nl = text.find("\n", begin + KEY_BLOCK_MAX, begin + KEY_BLOCK_MAX + MAX_LINE)
    return len(text) if nl < 0 else nl


def redact(text: str) -> tuple[str, list[str]]:
    """Text without secrets -> (text, the kinds found, each once)."""
    out: list[str] = []
    kinds: list[str] = []
    pos = 0
    while pos < len(text):
        m = BEGIN.search(text, pos)
        stop = m.start() if m else len(text)
        clean, found = _redact_lines(text[pos:stop])
        out.append(clean)
        kinds += found
        if m is None:
            break
        pos = key_block_end(text, m.start())
        out.append(REDACTED)
        kinds.append("private_key")
    return "".join(out), list(dict.fromkeys(kinds))
