"""The version diff's line matching: a valid diff of any two texts, exact where it is short,
and bounded where a template repeats lines all over."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.history import EXACT_DIFF_LINES, _Matcher, line_diff
from registry.models import TemplateVersion

LINES = st.lists(st.sampled_from(["{%- endif %}", "{{ x }}", "{{ y }}", "a", "b", ""]), max_size=40)


def rebuilt(a: list[str], b: list[str]) -> tuple[list[str], list[str]]:
    """Both sides again from the matcher's opcodes."""
    old, new = [], []
    for tag, i1, i2, j1, j2 in _Matcher(a, b).get_opcodes():
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        old += a[i1:i2]
        new += b[j1:j2]
    return old, new


@settings(max_examples=300, deadline=None)
@given(LINES, LINES)
def test_the_opcodes_are_a_diff_of_the_two_texts(a: list[str], b: list[str]) -> None:
    assert rebuilt(a, b) == (a, b)
    if not (a and b) or (a[0] != b[0] and a[-1] != b[-1]):
        # Nothing shared at either end to set apart: difflib's own exact matching, as before.
        exact = difflib.SequenceMatcher(None, a, b, autojunk=False)
        assert _Matcher(a, b).get_opcodes() == exact.get_opcodes()


@pytest.mark.django_db
@pytest.mark.timeout(60)
def test_two_long_templates_that_repeat_lines_are_diffed_in_bounded_work() -> None:
    """6,000 lines a side, every third one changed: difflib told that no line is junk ran for
    more than 300 s on it (8.4 s at 1,200 lines, served to anyone)."""
    old = "\n".join("{%- endif %}" if i % 3 else "{{ x }}" for i in range(6000))
    new = "\n".join("{%- endif %}" if i % 3 else "{{ y }}" for i in range(6000))
    a, _ = TemplateVersion.objects.get_or_create_for_text(old)
    b, _ = TemplateVersion.objects.get_or_create_for_text(new)
    rows = line_diff(a, b)
    assert [r.text for r in rows if r.kind in ("same", "del")] == old.split("\n")
    assert [r.text for r in rows if r.kind in ("same", "add")] == new.split("\n")


@pytest.mark.django_db
def test_one_line_changed_in_a_long_template_is_one_line_of_the_diff() -> None:
    lines = [
        "{%- endif %}" if i % 2 else f"{{{{ part_{i} }}}}" for i in range(4 * EXACT_DIFF_LINES)
    ]
    changed = list(lines)
    changed[700] = "{{ part_700 | trim }}"
    a, _ = TemplateVersion.objects.get_or_create_for_text("\n".join(lines))
    b, _ = TemplateVersion.objects.get_or_create_for_text("\n".join(changed))
    rows = line_diff(a, b)
    assert [(r.kind, r.old, r.new) for r in rows if r.kind in ("add", "del")] == [
        ("del", 701, None),
        ("add", None, 701),
    ]
