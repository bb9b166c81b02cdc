"""README badges: `prompt cache | safe`, drawn like shields.io badges, no external service."""

from __future__ import annotations

from django.utils.html import escape

from registry.models import Verdict

LABEL = "prompt cache"
# (text, colour) per verdict; colours keep 4.5:1 contrast with white text.
STYLES = {
    Verdict.SAFE: ("safe", "#1a7f37"),
    Verdict.UNSAFE: ("breaks", "#c2261f"),
    Verdict.SAFE_WHERE_RENDERABLE: ("safe where it renders", "#8a5a00"),
    Verdict.ERROR: ("does not render", "#57606a"),
    Verdict.PENDING: ("checking", "#57606a"),
}
UNKNOWN = ("not tracked", "#57606a")
#: A client profile that does not apply to the template (it never reads thinking chunks, …).
NOT_APPLICABLE = "not_applicable"
#: A badge URL whose ?client=, ?engine= or ?thinking= names nothing we know (a 400).
BAD_SETUP = "bad_setup"
CHAR_WIDTH = 6.6  # Verdana 11px, close enough for short ASCII labels
PADDING = 10


def _width(text: str) -> int:
    return int(len(text) * CHAR_WIDTH + 2 * PADDING)


def render_badge(verdict: str | None) -> str:
    if verdict == NOT_APPLICABLE:
        text, colour = "does not apply", "#57606a"
    elif verdict == BAD_SETUP:
        text, colour = "unknown setup in the URL", "#c2261f"
    else:
        text, colour = STYLES.get(verdict, UNKNOWN) if verdict else UNKNOWN  # type: ignore[call-overload]
    left, right = _width(LABEL), _width(text)
    total = left + right
    label, value = escape(LABEL), escape(text)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="20" role="img" '
        f'aria-label="{label}: {value}"><title>{label}: {value}</title>'
        f'<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" '
        f'stop-opacity=".1"/><stop offset="1" stop-opacity=".1"/></linearGradient>'
        f'<clipPath id="r"><rect width="{total}" height="20" rx="3" fill="#fff"/></clipPath>'
        f'<g clip-path="url(#r)"><rect width="{left}" height="20" fill="#555"/>'
        f'<rect x="{left}" width="{right}" height="20" fill="{colour}"/>'
        f'<rect width="{total}" height="20" fill="url(#s)"/></g>'
        f'<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" '
        f'font-size="11"><text x="{left / 2}" y="14">{label}</text>'
        f'<text x="{left + right / 2}" y="14">{value}</text></g></svg>'
    )
