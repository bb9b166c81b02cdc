"""What the database can hold of data from outside (a probe's report, a check's report):
PostgreSQL's text and JSON take no NUL character, no UTF-8 encoder takes a lone surrogate
(which JSON can escape, and Jinja can write), and a JSON column takes no NaN or infinity."""

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
