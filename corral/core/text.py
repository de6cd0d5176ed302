"""What the gateway accepts as text in what a caller writes (a note, a field of a body):
checked in one place for every edge and verb, and the shapes its names and ids take."""

from __future__ import annotations

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""An image's name (and what names one: a key, a build's digest)."""
IMAGE_REF = r"^([a-z][a-z0-9_.-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""What names an image in a job: NAME (the caller's own image of that name, or a key),
or OWNER/NAME (another principal's, named explicitly: gateway/images.py)."""
WS_ID = r"^ws-[0-9a-f]{12}$"
"""A workspace's id."""
ABS_PATH = r"^/[^\x00]*$"
"""A directory to fork."""
SHAPES = {
    WS_ID: "a workspace id as `corral workspace fork` printed it: ws- and 12 hex digits",
    NAME: "a name of 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
    IMAGE_REF: "an image's name, its key, or OWNER/NAME for another principal's image",
    ABS_PATH: "an absolute path",
}
"""Each pattern said as what to write instead of as a regex (core/errors.py's refusals)."""


def text_problem(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where} holds a NUL character (\\u0000); remove it"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{where} holds half of a UTF-16 surrogate pair ({text[e.start]!r} at character {e.start}), "
                "which is not text; send valid Unicode")
    return None
