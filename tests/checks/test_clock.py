"""The clock moves between the requests of a session, as it does in a real agent loop."""

from __future__ import annotations

from checks.engine import CLOCK_STEP, RenderCall, run_check
from checks.findings import DATE_DEPENDENT, TIME_DEPENDENT
from checks.options import DEFAULT_NOW, CheckOptions
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import HISTORY, SAFE, UNSAFE, TemplateReport
from checks.sources import TemplateSource

# Line 1 writes the clock in the format FORMAT; the rest is a prefix-stable chat.
CLOCKED = """{{- 'Now: ' + strftime_now('FORMAT') + '\\n' -}}
{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# The time is read on line 1 and written on line 3: the break is attributed to line 3.
SET_THEN_WRITTEN = """{%- set now = strftime_now('%H:%M') -%}
{%- for m in messages -%}
{%- if loop.first %}[{{ now }}]{% endif %}<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


def check(text: str, calls: list[RenderCall] | None = None) -> TemplateReport:
    return run_check(
        TemplateSource({"default": text}),
        TemplateCache(CheckEnvironment()),
        options=CheckOptions(),
        observer=None if calls is None else calls.append,
    )


def test_time_of_day_in_the_prompt_breaks_every_request() -> None:
    report = check(CLOCKED.replace("FORMAT", "%H:%M:%S"))
    assert report.verdict == UNSAFE
    chat = [f for f in report.failures if f.session == "chat"]
    assert [f.request_index for f in chat] == [1, 2]
    first = chat[0]
    assert first.cause == HISTORY
    assert first.template_lines == (1,)
    # "Now: 09:30:00" against "Now: 09:47:13": the minutes differ at byte 8.
    assert first.byte_offset == len("Now: 09:")
    assert "strftime_now" in first.detail
    assert "The prompt includes the current time (template line 1)" in report.summary
    (time,) = [f for f in report.findings if f.kind == TIME_DEPENDENT]
    assert (time.lines, time.status) == ((1,), "confirmed")
    assert "'%H:%M:%S'" in time.message
    assert not [f for f in report.findings if f.kind == DATE_DEPENDENT]


def test_the_hour_alone_changes_within_a_session() -> None:
    # 09:30, then 09:47, then 10:04: the hour changes between the second and third request.
    report = check(CLOCKED.replace("FORMAT", "%H"))
    assert report.verdict == UNSAFE
    assert [f.request_index for f in report.failures if f.session == "chat"] == [2]


def test_a_date_only_format_is_stable_within_a_day_and_says_so() -> None:
    report = check(CLOCKED.replace("FORMAT", "%d %b %Y"))
    assert report.verdict == SAFE
    assert report.failures == ()
    assert report.summary.endswith(
        "The prompt includes the current date (template line 1): a cached prefix stops matching "
        "when the date changes."
    )
    (date,) = [f for f in report.findings if f.kind == DATE_DEPENDENT]
    assert date.status == "informational"
    assert not [f for f in report.findings if f.kind == TIME_DEPENDENT]


def test_a_time_set_on_one_line_and_written_on_another_is_still_the_clock() -> None:
    report = check(SET_THEN_WRITTEN)
    assert report.verdict == UNSAFE
    first = next(f for f in report.failures if f.session == "chat")
    assert first.template_lines == (3,)
    assert first.detail.startswith("the time strftime_now writes changes between requests")
    (time,) = [f for f in report.findings if f.kind == TIME_DEPENDENT]
    assert time.status == "confirmed"


def test_each_request_is_rendered_one_step_later_only_when_the_clock_is_read() -> None:
    calls: list[RenderCall] = []
    check(CLOCKED.replace("FORMAT", "%d %b %Y"), calls)
    times = {call.now for call in calls}
    assert {DEFAULT_NOW, DEFAULT_NOW + CLOCK_STEP, DEFAULT_NOW + 2 * CLOCK_STEP} <= times
    # Within the day: the date the template writes never changes inside a session.
    assert {t.date() for t in times} == {DEFAULT_NOW.date()}
    calls.clear()
    check("{% for m in messages %}{{ m.content }}{% endfor %}", calls)
    assert {call.now for call in calls} == {DEFAULT_NOW}
