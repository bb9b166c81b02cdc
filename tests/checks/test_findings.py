"""Static findings carry line numbers and are confirmed, or not, by what the renders showed."""

from __future__ import annotations

from checks.engine import run_check
from checks.findings import (
    DATE_DEPENDENT,
    LOOP_POSITION_GATING,
    MOVED_TO_LATER_MESSAGE,
    MOVING_MARKER,
    RAISES,
    THINKING_STRIPPED,
)
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import SAFE, SAFE_WHERE_RENDERABLE, UNSAFE, Finding, TemplateReport
from checks.sources import TemplateSource


def check(text: str) -> TemplateReport:
    return run_check(TemplateSource({"default": text}), TemplateCache(CheckEnvironment()))


def finding(report: TemplateReport, kind: str) -> Finding:
    (found,) = [f for f in report.findings if f.kind == kind]
    return found


LAST_QUERY = """{%- set ns = namespace(last_query_index=messages|length - 1) -%}
{%- for m in messages -%}
{%- if m.role == 'user' %}{% set ns.last_query_index = loop.index0 %}{% endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- if loop.index0 == ns.last_query_index -%}
<query>{{ m.content }}</query>
{%- else -%}
<{{ m.role }}>{{ m.content }}</{{ m.role }}>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# The blog post's pattern 2: loop.last decides who writes <|im_end|>, and both paths converge.
CONVERGING_LOOP_LAST = """{%- for m in messages -%}
<|im_start|>{{ m.role }}
{{ m.content }}
{%- if not loop.last %}<|im_end|>
{% endif -%}
{%- endfor -%}
<|im_end|>
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

MISTRAL_TOOLS = """{%- for m in messages -%}
{%- if m.role == 'user' -%}
{%- if tools and loop.last -%}[TOOLS]{{ tools | tojson }}[/TOOLS]{%- endif -%}
[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' -%}
{{ m.content }}</s>
{%- endif -%}
{%- endfor -%}
"""

ALTERNATION = """{%- for m in messages -%}
{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}
{%- endif -%}
{{ m.role }}: {{ m.content }}
{% endfor -%}
{%- if add_generation_prompt %}assistant:{% endif -%}
"""

DATED_AND_STRIPPED = """Today is {{ strftime_now('%d %B %Y') }}.
{% for m in messages -%}
{%- set content = m.content.split('</think>')[-1] if m.role == 'assistant' else m.content -%}
{{ m.role }}: {{ content }}
{% endfor -%}
{%- if add_generation_prompt %}assistant:{% endif -%}
"""


def test_moving_marker_is_found_and_confirmed() -> None:
    report = check(LAST_QUERY)
    marker = finding(report, MOVING_MARKER)
    assert marker.lines == (1, 3, 6)
    assert marker.status == "confirmed"
    assert any("chat pair 1" in item for item in marker.evidence)
    assert report.verdict == UNSAFE


def test_converging_loop_last_is_found_but_not_observed() -> None:
    report = check(CONVERGING_LOOP_LAST)
    gating = finding(report, LOOP_POSITION_GATING)
    assert gating.lines == (4,)
    assert gating.status == "not_observed"
    assert report.verdict == SAFE


def test_tools_moved_to_the_last_user_message() -> None:
    report = check(MISTRAL_TOOLS)
    moved = finding(report, MOVED_TO_LATER_MESSAGE)
    assert moved.lines == (3,)
    assert moved.status == "confirmed"
    assert any(item.endswith("chat_with_tools pair 1") for item in moved.evidence)
    (failure, *_) = [f for f in report.failures if f.session == "chat_with_tools"]
    # "[TOOLS]…" against "[INST]…": the same first byte, then the tools block moves away.
    assert (failure.byte_offset, failure.segment, failure.segment_next) == (1, "tools", "user 1")
    assert failure.detail == "the tools block is written differently once a turn is added"
    # Without tools the same template is prefix-stable.
    (variant,) = report.variants
    chat = next(s for s in variant.sessions if s.session == "chat_no_system")
    assert all(p.status == "pass" for p in chat.pairs)


def test_raise_exception_constraint_linked_to_the_sessions_it_refuses() -> None:
    report = check(ALTERNATION)
    raises = finding(report, RAISES)
    assert raises.lines == (3,)
    assert raises.message.startswith("Conversation roles must alternate")
    assert raises.status == "confirmed"
    assert any("chat raises" in item for item in raises.evidence)
    assert report.verdict == SAFE_WHERE_RENDERABLE


def test_date_and_think_stripping_are_reported() -> None:
    report = check(DATED_AND_STRIPPED)
    date = finding(report, DATE_DEPENDENT)
    assert (date.lines, date.status) == ((1,), "informational")
    assert report.summary.endswith(
        "The prompt includes the current date (template line 1): a cached prefix stops matching "
        "when the date changes."
    )
    stripped = finding(report, THINKING_STRIPPED)
    assert stripped.lines == (3,)
    # The template never reads a reasoning field: reasoning is not its concern, nothing breaks.
    assert stripped.status == "not_observed"
    assert report.verdict == SAFE


def test_raise_exception_names_the_constraint() -> None:
    report = check(ALTERNATION)
    assert finding(report, RAISES).message.endswith("[constraint: role alternation]")


# Tools written before the last user message, found through `user_messages[-1]`; the tool list's
# own `loop.last` (a nested loop) only places commas and is no finding.
LAST_USER_TOOLS = """{%- set users = messages | selectattr('role', 'equalto', 'user') | list -%}
{%- for m in messages -%}
{%- if m.role == 'user' and tools and m == users[-1] -%}
[TOOLS]{% for t in tools %}{{ t.function.name }}{% if not loop.last %},{% endif %}{% endfor %}]
{%- endif -%}
{{ m.role }}: {{ m.content }}
{% endfor -%}
{%- if add_generation_prompt %}assistant:{% endif -%}
"""


def test_last_element_tests_and_nested_loops() -> None:
    report = check(LAST_USER_TOOLS)
    moved = finding(report, MOVED_TO_LATER_MESSAGE)
    assert (moved.lines, moved.status) == ((3,), "confirmed")
    assert not [f for f in report.findings if f.kind == LOOP_POSITION_GATING]
