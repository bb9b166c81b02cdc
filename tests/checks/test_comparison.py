"""Hand-written templates showing each cause with its exact offset, segment and template line."""

from __future__ import annotations

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from checks import SandboxPool, check_template
from checks.comparison import common_prefix
from checks.engine import run_check
from checks.rendering import CheckEnvironment, TemplateCache
from checks.reports import (
    ASSISTANT_OUTPUT,
    GENERATION_PROMPT,
    HISTORY,
    SAFE,
    TOKEN_SEAM,
    UNSAFE,
    RequestPair,
    TemplateReport,
)
from checks.seedcheck import GENERATION_PROMPT_ARTIFACT
from checks.sources import TemplateSource
from tests.checks.conftest import CHATML, REASONING_ON_LAST

# Line 2 marks the last user message: once another turn arrives, that marker moves.
MOVING_MARKER = """{%- for m in messages -%}
{%- if loop.last and m.role == 'user' %}[LAST]{% endif -%}
{{ '<' + m.role + '>' }}{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""

# Line 4: the generation prompt opens and closes an empty think block history never writes.
EMPTY_THINK_PROMPT = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant><think></think>{% endif -%}
"""

# Without a generation prompt the render ends with <end>, so history is not a prefix of the
# prompt; line 4's generation prompt writes " /think" where history writes the reply.
MARKER_IN_GENERATION_PROMPT = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant> /think{% else %}<end>{% endif -%}
"""

# History writes a space before assistant content that the model did not emit.
LEADING_SPACE = """{%- for m in messages -%}
<{{ m.role }}>{% if m.role == 'assistant' %} {% endif %}{{ m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


def report_for(text: str) -> TemplateReport:
    return run_check(TemplateSource({"default": text}), TemplateCache(CheckEnvironment()))


def pair(report: TemplateReport, session: str, index: int) -> RequestPair:
    (variant,) = report.variants
    (result,) = [s for s in variant.sessions if s.session == session]
    return result.pairs[index - 1]


def test_chatml_is_safe_everywhere() -> None:
    report = report_for(CHATML)
    assert report.verdict == SAFE
    assert report.failures == ()
    assert report.summary.startswith("Cache-safe in every session")


def test_moving_marker_is_a_history_failure_at_the_marker() -> None:
    report = report_for(MOVING_MARKER)
    result = pair(report, "chat_no_system", 1)
    assert (result.status, result.cause) == ("fail", HISTORY)
    divergence = result.divergence
    assert divergence is not None
    # P1 starts with "[LAST]<user>…", P2 with "<user>…": they differ at the very first byte.
    assert divergence.byte_offset == 0
    assert divergence.segment_before == "user 1"
    assert divergence.lines_before == (2,)
    assert divergence.lines_after == (3,)
    assert report.verdict == UNSAFE
    assert result.reusable_share == 0.0


# The moving marker, in a template that writes reasoning back: a client that sends it differs.
MOVING_MARKER_WITH_REASONING = """{%- for m in messages -%}
{%- if loop.last and m.role == 'user' %}[LAST]{% endif -%}
<{{ m.role }}>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}
{{- m.content }}</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


def test_a_client_other_than_the_typical_says_where_it_breaks_without_attribution() -> None:
    """The other clients' pairs skip line attribution (their cost): the sentence a reader
    gets then names the history and the byte, not a placeholder."""
    report = report_for(MOVING_MARKER_WITH_REASONING)
    (variant, *_) = report.variants
    other = next(c for c in variant.clients if c.profile == "reasoning_content")
    failed = next(
        p
        for s in other.sessions
        if s.session.startswith("reasoning")  # the sessions this client sends its own way
        for p in s.pairs
        if p.status == "fail"
    )
    assert failed.divergence is not None and failed.divergence.segment_before == "unknown"
    assert failed.detail == (
        f"the history, from byte {failed.divergence.byte_offset}, "
        "is written differently once a turn is added"
    )


@pytest.mark.parametrize(
    ("template", "written"),
    [(EMPTY_THINK_PROMPT, "<think></think>"), (MARKER_IN_GENERATION_PROMPT, " /think")],
    ids=["empty_think_block", "marker_where_history_ends_otherwise"],
)
def test_generation_prompt_not_reproduced_by_history(template: str, written: str) -> None:
    report = report_for(template)
    result = pair(report, "chat", 1)
    assert (result.status, result.cause) == ("fail", GENERATION_PROMPT)
    divergence = result.divergence
    assert divergence is not None
    system = "<system>You are a careful assistant for a travel agency. Answer briefly.</s>"
    user = "<user>What's the weather in Paris today?</s>"
    assert divergence.byte_offset == len(system + user + "<assistant>")
    assert divergence.segment_before == "generation prompt"
    assert divergence.segment_after == "assistant 1"
    assert divergence.lines_before == (4,)
    assert divergence.lines_after == (2,)
    assert divergence.text_before.startswith(written)
    pure_chat = {s.classification for s in report.seed_check if s.shape == "pure_chat"}
    assert pure_chat == {GENERATION_PROMPT}


# Line 3: " /think" goes on the latest message (a user turn in chat) only when a generation
# prompt follows, so once the conversation goes on that turn is written without it: an edit of
# history.
MARKER_ON_LATEST_MESSAGE = """{%- for m in messages -%}
<{{ m.role }}>{{ m.content }}
{%- if loop.last and add_generation_prompt %} /think{% endif -%}
</s>
{%- endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
"""


def test_a_generation_prompt_that_edits_the_latest_user_turn_is_a_history_failure() -> None:
    """The bytes that change are in user k, not after it: the reader is sent to that turn."""
    report = report_for(MARKER_ON_LATEST_MESSAGE)
    system = "<system>You are a careful assistant for a travel agency. Answer briefly.</s>"
    user = "<user>What's the weather in Paris today?"
    for index in (1, 2):
        result = pair(report, "chat", index)
        assert (result.status, result.cause) == ("fail", HISTORY)
        assert result.detail == f"user {index} is written differently once a turn is added"
        divergence = result.divergence
        assert divergence is not None
        assert divergence.segment_before == divergence.segment_after == f"user {index}"
        assert divergence.lines_before == (3,)
        assert divergence.text_before.startswith(" /think</s>")
    first = pair(report, "chat", 1).divergence
    assert first is not None and first.byte_offset == len(system + user)
    assert report.verdict == UNSAFE
    seed = {s.shape: s.classification for s in report.seed_check}
    # The literal check's tool shapes ask for a generation prompt after the assistant's own call,
    # which no request does: the marker it gets there is the artifact's doing.
    assert (seed["pure_chat"], seed["single_tool_call"]) == (HISTORY, GENERATION_PROMPT_ARTIFACT)


def test_reply_reframed_is_a_warning_not_a_failure() -> None:
    report = report_for(LEADING_SPACE)
    result = pair(report, "chat", 1)
    assert (result.status, result.cause) == ("warn", ASSISTANT_OUTPUT)
    assert "' '" in result.detail
    assert report.verdict == SAFE
    assert "whether that costs a cache hit depends on what the model really emits" in (
        report.summary
    )


def test_dropped_reasoning_costs_the_reply_not_the_prompt() -> None:
    report = report_for(REASONING_ON_LAST)
    result = pair(report, "reasoning_history", 1)
    # Request 1 is a prefix of request 2; the reasoning the model emitted is not.
    assert (result.status, result.cause) == ("reply", ASSISTANT_OUTPUT)
    assert (result.prompt_reuse, result.reply_reuse) == (True, False)
    assert result.detail == "the client does not send back the reasoning the model emitted"
    kept = next(c for c in report.variants[0].clients if c.profile == "reasoning_content")
    sent = next(p for s in kept.sessions if s.session == "reasoning_history" for p in s.pairs)
    assert sent.status == "reply"
    assert sent.detail == "the reasoning the model emitted is dropped from history"
    assert pair(report, "chat", 1).status == "pass"
    # Not a broken prefix: the verdict stays safe and the summary says what the reply costs.
    assert report.verdict == SAFE
    assert "re-reads the reply" in report.summary
    assert "reasoning_history" in report.summary


def test_reusable_share_is_measured_from_the_renders() -> None:
    report = report_for(EMPTY_THINK_PROMPT)
    result = pair(report, "chat", 1)
    divergence = result.divergence
    assert divergence is not None
    assert result.reusable_share == round(divergence.byte_offset / result.next_bytes, 4)


def test_common_prefix() -> None:
    assert common_prefix("abcdef", "abcxyz") == 3
    assert common_prefix("abc", "abcdef") == 3
    assert common_prefix("", "x") == 0
    assert common_prefix("é漢字", "é漢x") == 2


@pytest.fixture(scope="module")
def newline_merging_tokenizer() -> str:
    """A tiny byte-level BPE in which "\\n\\n" is one token, as in real vocabularies."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["assistant\n\nIt is sunny.\n\n", "user\n\nhello\n\nworld\n\n"] * 50
    tokenizer.train_from_iterator(corpus, trainer)
    assert tokenizer.encode("\n\n").ids == [tokenizer.token_to_id("ĊĊ")]
    return str(tokenizer.to_str())


def test_token_seam_where_bytes_match(newline_merging_tokenizer: str, pool: SandboxPool) -> None:
    report = check_template(CHATML, tokenizer_json=newline_merging_tokenizer, pool=pool, cache=None)
    # The padded reply starts with "\n\n": after the prompt's "assistant\n" the bytes still match,
    # but "\n" + "\n\n" tokenizes differently once it is one string.
    seams = [f for f in report.failures if f.cause == TOKEN_SEAM]
    assert {f.session for f in seams} >= {"padded_content"}
    seam = next(f for f in seams if f.session == "padded_content" and f.request_index == 1)
    assert seam.token_index is not None
    assert seam.status == "fail"
    assert report.tokenizer_sha256 is not None
    # Plain chat replies start with a letter: no seam there.
    chat = list(report.variants)[0].sessions[0]
    assert chat.session == "chat" and all(p.status == "pass" for p in chat.pairs)
    assert all(p.token_reusable_share is not None for p in chat.pairs)


@pytest.mark.parametrize(
    "unreadable",
    [
        '{"version": "1.0", "model": {"type": "BPE"}}',  # no vocabulary: what a stub holds
        '{"version": "1.0", "model": {"type": "BPE", "vocab": {',  # cut short
        "version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n",  # LFS pointer
    ],
)
def test_an_unreadable_tokenizer_costs_the_token_checks_not_the_verdict(
    unreadable: str, pool: SandboxPool
) -> None:
    on_bytes = check_template(REASONING_ON_LAST, pool=pool, cache=None)
    report = check_template(REASONING_ON_LAST, tokenizer_json=unreadable, pool=pool, cache=None)
    assert report.verdict == on_bytes.verdict != "error"
    assert report.summary.startswith(on_bytes.summary)
    assert "(Checked on bytes only: the tokenizer.json could not be read (" in report.summary
    assert report.summary.endswith(".)") and not report.summary.endswith("..)")
    assert [f.cause for f in report.failures] == [f.cause for f in on_bytes.failures]


# History writes a "\n" before the reply that the generation prompt does not end with: a warning
# on bytes, and with a vocabulary where "\n\n" is one token, a broken token prefix too.
NEWLINE_BEFORE_REPLY = """{%- for m in messages -%}
{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}{{ '\\n' }}{% endif %}
{{- m.content + '<|im_end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}
"""


def test_token_seam_is_checked_on_a_pair_that_only_warns() -> None:
    # Runs of newlines are one pre-token, as in Qwen's pre-tokenizer: "\n" + "\n" is one token.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\s*[\r\n]+|\s+|[^\s]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["assistant\n\nIt is sunny.\n\n", "user\n\nhello\n\n"] * 50, trainer
    )
    assert tokenizer.encode("x\n\nIt").tokens[1] == "ĊĊ"

    def tokens(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    source = TemplateSource({"default": NEWLINE_BEFORE_REPLY})
    without = run_check(source, TemplateCache(CheckEnvironment()))
    # Bytes alone: the added "\n" is only a reframed reply.
    assert (pair(without, "chat", 1).status, pair(without, "chat", 1).cause) == (
        "warn",
        ASSISTANT_OUTPUT,
    )
    report = run_check(source, TemplateCache(CheckEnvironment()), tokens=tokens)
    result = pair(report, "chat", 1)
    assert (result.status, result.cause) == ("fail", TOKEN_SEAM)
    assert result.detail.endswith(
        "(and history writes '\\n' before the reply, not part of the prompt)"
    )
    divergence = result.divergence
    assert divergence is not None and divergence.token_index is not None
    assert report.verdict == UNSAFE


# Tool calls are written only for content None (sessions send content ""), so never; the tool
# result line prints the tool's name, which is the only place the name then appears.
DROPPED_CALL_NAMED_RESULT = """{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>tool name={{ m.name }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' and m.content is none and m.tool_calls %}<|im_start|>assistant
{% for tc in m.tool_calls %}<tool_call>{{ tc.function.name }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_dropped_tool_call_is_not_masked_by_the_tool_results_name() -> None:
    """The name of a call history never writes appeared later, in the tool result's line, and
    the pair passed: safe on a hybrid model, the reply said to carry over."""
    report = run_check(
        TemplateSource({"default": DROPPED_CALL_NAMED_RESULT}), TemplateCache(CheckEnvironment())
    )
    (variant,) = report.variants
    (session,) = [s for s in variant.sessions if s.session == "tool_round"]
    first = session.pairs[0]
    assert first.status == "reply", first
    assert first.cause == ASSISTANT_OUTPUT
    assert "tool call to" in first.detail
    typical = variant.clients[0]
    assert typical.reply_reused is False
    assert typical.engines["hybrid"] == UNSAFE
