"""The reader's setup: client profile × engine cache class × template setting, and its verdict.

Pure functions of a `TemplateReport`; the pages, the badge, the API and the CLI take a setup from
`?client=…&engine=…&thinking=…` (or options) and show the verdict for it, with one sentence on
what to do and what the rest costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from checks.clients import PROFILE_NAMES, PROFILES, TYPICAL
from checks.policy import error_reason, is_primary, kwargs_hint
from checks.reports import (
    ERROR,
    SAFE,
    SAFE_WHERE_RENDERABLE,
    UNSAFE,
    ClientResult,
    TemplateReport,
    VariantResult,
)
from checks.reuse import CACHE_CLASSES, HYBRID, HYBRID_CHECKPOINTS, TRIMMABLE

THINKING_DEFAULT = "default"
THINKING_OFF = "off"
THINKING_ON = "on"
THINKING_CHOICES = (THINKING_DEFAULT, THINKING_OFF, THINKING_ON)
THINKING_SWITCH = "enable_thinking"

CLIENT_WORDS = {p.name: p.label for p in PROFILES}
ENGINE_WORDS = {
    TRIMMABLE: "a trimmable cache (mlx-lm or llama.cpp on a dense model)",
    "block": "a block cache (vLLM, SGLang)",
    HYBRID: "a hybrid model without cache checkpoints (mlx-lm's sequential path, llama.cpp "
    "without checkpoints)",
    HYBRID_CHECKPOINTS: "a hybrid model with cache checkpoints (mlx_lm.server's batched path, "
    "llama.cpp with checkpoints)",
}
THINKING_WORDS = {
    THINKING_DEFAULT: "the template's defaults",
    THINKING_OFF: "enable_thinking=false",
    THINKING_ON: "enable_thinking=true",
}


#: The parts of a setup, as the site's query string and the CLI's options name them.
SETUP_PARTS = ("client", "engine", "thinking")


def setup_value(value: str | None) -> str:
    """A setup part as given, without the whitespace around it (a value pasted from a link,
    `?engine=%20hybrid`), "" for none. Every surface reads a part through this, then validates
    it exactly: the pages, the badge, the API's schemas and the CLI's options."""
    return (value or "").strip()


def given_parts(params: Any) -> dict[str, str]:
    """The setup parts `params` (a QueryDict, the CLI's options) give, through `setup_value`;
    a part left blank (`?client=`, as the catalog's form sends the typical client) is left out."""
    found = {part: setup_value(params.get(part)) for part in SETUP_PARTS}
    return {part: value for part, value in found.items() if value}


def is_chosen(params: Any) -> bool:
    """Whether `params` choose a setup: any part given, even with the headline's value.
    `?thinking=default` asks for the template's defaults alone; the headline verdict counts
    every setting a caller meets. The catalog, the API, the model page, the badge and the CLI
    all judge a chosen setup by its own verdict."""
    return bool(given_parts(params))


class SetupError(ValueError):
    """A setup parameter with a value we do not know."""


@dataclass(frozen=True)
class Setup:
    client: str = TYPICAL.name
    engine: str = TRIMMABLE
    thinking: str = THINKING_DEFAULT

    @classmethod
    def parse(cls, params: Any) -> Setup:
        """From a mapping (a QueryDict, CLI options), each part through `setup_value`; missing
        or blank parts take the headline's value."""
        given = given_parts(params)
        client = given.get("client", TYPICAL.name)
        engine = given.get("engine", TRIMMABLE)
        thinking = given.get("thinking", THINKING_DEFAULT)
        for name, value, known in (
            ("client", client, PROFILE_NAMES),
            ("engine", engine, CACHE_CLASSES),
            ("thinking", thinking, THINKING_CHOICES),
        ):
            if value not in known:
                raise SetupError(f"unknown {name} {value!r}: use one of {', '.join(known)}")
        return cls(client, engine, thinking)

    @property
    def is_headline(self) -> bool:
        return self == Setup()

    @property
    def params(self) -> dict[str, str]:
        """The parts a link that chooses this setup carries: the headline's values are left out
        (the typical client is the absent one), and a setup of them alone is `thinking=default`,
        the template's defaults judged alone; no part at all would be the headline, which
        counts every setting. The one spelling of a setup: the pages send others to it."""
        defaults = Setup().__dict__
        parts = {k: v for k, v in self.__dict__.items() if v != defaults[k]}
        return parts or {"thinking": THINKING_DEFAULT}

    def query(self, **changes: str) -> str:
        """The query string that chooses this setup with some parts changed (`params`)."""
        parts = replace(self, **changes).params
        return "?" + "&".join(f"{k}={v}" for k, v in parts.items())

    def words(self) -> str:
        return (
            f"a client that {CLIENT_WORDS[self.client]}, {ENGINE_WORDS[self.engine]}, "
            f"{THINKING_WORDS[self.thinking]}"
        )


def reply_fate(client: ClientResult) -> str:
    """What becomes of the model's reply for one client, in a few words ("" if unknown)."""
    if client.reply_reused:
        return "carries over"
    if client.reply_units is not None:
        return f"re-read, about {round(client.reply_units)} {client.unit}"
    return ""


def variant_for(report: TemplateReport, thinking: str) -> VariantResult | None:
    """The setting a `thinking` choice selects; a template without the switch has one."""
    variants = [v for v in report.variants if v.template_name == "default"] or list(report.variants)
    if not variants:
        return None
    if thinking != THINKING_DEFAULT:
        wanted = thinking == THINKING_ON
        for variant in variants:
            if (
                set(variant.kwargs) == {THINKING_SWITCH}
                and variant.kwargs[THINKING_SWITCH] is wanted
            ):
                return variant
    return next((v for v in variants if not v.kwargs), variants[0])


def verdict_in(variant: VariantResult, client: str, engine: str) -> str | None:
    """One setting's verdict for a client on an engine; None when the profile does not apply."""
    found = next((c for c in variant.clients if c.profile == client), None)
    if found is None:
        # A report from before client profiles: only the typical client on a trimmable cache.
        return variant.verdict if (client, engine) == (TYPICAL.name, TRIMMABLE) else None
    if found.verdict is None:
        return None
    return found.engines.get(engine, found.verdict)


@dataclass(frozen=True)
class SettingChip:
    """One setting of the template under the reader's client and engine."""

    label: str
    kwargs: dict[str, Any]
    verdict: str | None
    thinking: str | None  # the `thinking` choice that selects it, if any
    chosen: bool


@dataclass(frozen=True)
class SetupVerdict:
    setup: Setup
    verdict: str | None  # None: the client profile does not apply to this template
    setting: str
    sentence: str
    chips: tuple[SettingChip, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.setup.client,
            "engine": self.setup.engine,
            "thinking": self.setup.thinking,
            "verdict": self.verdict,
            "setting": self.setting,
            "sentence": self.sentence,
            "settings": [
                {"label": c.label, "kwargs": c.kwargs, "verdict": c.verdict} for c in self.chips
            ],
        }


def _thinking_choice(variant: VariantResult) -> str | None:
    if variant.template_name != "default":
        return None
    if not variant.kwargs:
        return THINKING_DEFAULT
    if set(variant.kwargs) == {THINKING_SWITCH}:
        return THINKING_ON if variant.kwargs[THINKING_SWITCH] is True else THINKING_OFF
    return None


def _kwargs_hint(variant: VariantResult) -> str:
    return kwargs_hint(variant, nothing="no chat_template_kwargs")


def setup_verdict(report: TemplateReport, setup: Setup) -> SetupVerdict | None:
    """The verdict for a setup, each setting's verdict as a chip, and one sentence on what to do
    and what the rest costs. None for a report with nothing to show (an error)."""
    variant = variant_for(report, setup.thinking)
    if variant is None or report.verdict == ERROR:
        return None
    chips = tuple(
        SettingChip(
            v.label,
            v.kwargs,
            verdict_in(v, setup.client, setup.engine),
            _thinking_choice(v),
            v is variant,
        )
        for v in report.variants
    )
    verdict = verdict_in(variant, setup.client, setup.engine)
    return SetupVerdict(
        setup, verdict, variant.label, _sentence(report, setup, variant, verdict), chips
    )


def _unrendered(variant: VariantResult, client: ClientResult | None) -> str:
    """Which conversations do not render under this setup, in words the CLI and the page both
    can print (the page's table of conversations is not in the CLI's output)."""
    sessions = (client.sessions if client is not None else ()) or variant.sessions
    refused = sorted(s.session for s in sessions if not s.rendered)
    if not refused:
        return "Some conversations do not render at all: this verdict is for the others."
    return (
        f"{len(refused)} of the conversations replayed do not render at all"
        f" ({', '.join(refused)}): this verdict is for the others."
    )


def _sentence(
    report: TemplateReport, setup: Setup, variant: VariantResult, verdict: str | None
) -> str:
    client = next((c for c in variant.clients if c.profile == setup.client), None)
    who = f"a client that {CLIENT_WORDS[setup.client]}"
    where = ENGINE_WORDS[setup.engine]
    if verdict is None:
        note = client.note if client is not None else "not measured by this engine version"
        return f"Does not apply to this template: {note}."
    if verdict == ERROR:
        return f"With {variant.label}, nothing renders ({error_reason([variant]).rstrip('.')})."
    if verdict in (SAFE, SAFE_WHERE_RENDERABLE):
        parts = [
            f"Cache-safe for {who} on {where}, with {variant.label} ({_kwargs_hint(variant)})."
        ]
        if verdict == SAFE_WHERE_RENDERABLE:
            parts.append(_unrendered(variant, client))
        breaking = [
            other.label
            for other in report.variants
            if other is not variant
            and is_primary(other)
            and verdict_in(other, setup.client, setup.engine) == UNSAFE
        ]
        if breaking:
            # The headline counts every setting a caller meets: say which one it is here, or
            # "Breaks the cache" at the top reads as a contradiction of this sentence.
            counted = (
                ", and the verdict at the top counts it"
                if setup.is_headline and report.verdict == UNSAFE
                else ""
            )
            parts.append(
                f"With {' or '.join(breaking)} it breaks{counted}: choose that setting above if "
                "your client or server sends it (mlx-lm's server passes enable_thinking itself)."
            )
        if client is not None and client.reply_reused is False and client.reply_units is not None:
            parts.append(
                f"Each turn still re-reads the model's previous reply, about "
                f"{round(client.reply_units)} {client.unit}: history does not write it back as "
                "the model emitted it."
            )
        return " ".join(parts)
    # It breaks: say where something else holds, in the order a reader can act on.
    parts = [f"Breaks the cache for {who} on {where}, with {variant.label}."]
    if client is not None:
        pairs = [p for s in (client.sessions or variant.sessions) for p in s.pairs]
        lost = [p for p in pairs if p.status == "fail"] or [p for p in pairs if p.status == "reply"]
        if lost:
            parts.append(
                f"First break: {lost[0].detail} ({lost[0].session}, request {lost[0].index})."
            )
    fixes = []
    for other in report.variants:
        if other is not variant and verdict_in(other, setup.client, setup.engine) in (
            SAFE,
            SAFE_WHERE_RENDERABLE,
        ):
            fixes.append(f"pass {_kwargs_hint(other)}")
            break
    others = [
        (profile, verdict_in(variant, profile.name, setup.engine))
        for profile in PROFILES
        if profile.name != setup.client
    ]
    # A client under which every conversation renders first; one under which the template
    # refuses some is advice with that said.
    for profile, found in sorted(others, key=lambda pair: pair[1] != SAFE):
        if found in (SAFE, SAFE_WHERE_RENDERABLE):
            refused = "" if found == SAFE else " (the template then refuses some conversations)"
            fixes.append(f"use a client that {profile.label}{refused}")
            break
    if setup.engine == HYBRID and verdict_in(variant, setup.client, HYBRID_CHECKPOINTS) in (
        SAFE,
        SAFE_WHERE_RENDERABLE,
    ):
        fixes.append("serve it with cache checkpoints (mlx_lm.server's batched path)")
    if fixes:
        parts.append("To keep the cache: " + "; or ".join(fixes) + ".")
    elif verdict == UNSAFE:
        parts.append("No other setting or client we checked keeps it on this engine.")
    return " ".join(parts)
