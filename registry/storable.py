"""What the database can hold of data from outside: PostgreSQL's text and JSON take no NUL
character, no UTF-8 encoder takes a lone surrogate (which JSON can escape, and Jinja can
write), and a JSON column takes no NaN or infinity. Text a repo must hold as it is (a template)
is refused with the reason (`unstorable_text`); a report is stored as the database holds it
(`storable`)."""

from __future__ import annotations

import math
from typing import Any


def storable(value: Any, depth: int = 0) -> Any:
    """`value` as a JSON column holds it: a number that is not finite (NaN, which the broker's
    JSON carries) is null, text loses NUL characters and lone surrogates, keys become text;
    deeper than 32 levels is cut (null)."""
    if depth > 32:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {str(storable(k, depth + 1)): storable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v, depth + 1) for v in value]
    return value if value is None or isinstance(value, bool | int) else str(value)


def unstorable_text(text: str, what: str) -> str:
    """Why the catalog cannot store `text` ("" when it can): PostgreSQL's text and JSON hold
    no NUL character, and no UTF-8 encoder takes a lone surrogate (which JSON can escape)."""
    if "\x00" in text:
        return f"{what} holds a NUL character (\\u0000), which the catalog cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{what} holds a lone surrogate (\\u{ord(text[exc.start]):04x}), not valid Unicode"
    return ""
