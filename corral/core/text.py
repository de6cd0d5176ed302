"""What the gateway accepts as text in what a caller writes (a note, a field of a body):
checked in one place for every edge and verb."""

from __future__ import annotations


def text_problem(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where} holds a NUL character (\\u0000); remove it"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{where} holds half of a UTF-16 surrogate pair ({text[e.start]!r} at character {e.start}), "
                "which is not text; send valid Unicode")
    return None
