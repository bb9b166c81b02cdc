"""The reuse figures the site and the CLI show, each defined once, with the words that name it.

Every figure is a share of the *next prompt*: of request k+1's bytes, the part a prefix cache can
take from request k (`RequestPair.reusable_share`, measured in `checks.comparison`). What differs
from one figure to the next is only which request pairs it is the mean of:

- one pair: the pair page ("a prefix cache can reuse 30% of request 3");
- every pair of every conversation a setting renders: the settings grid's "Reused" column and the
  catalog's "Prompt reuse" column (`VariantResult.mean_reusable_share`);
- the pairs that break: the summary's "only about 30%" for one setting, and the break list's
  range and mean for pairs that break the same way.

So that two places can never round one number two ways, `percent` is the only formatter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .reports import RequestPair, SessionResult


def percent(share: float | None) -> str:
    """A share as the pages print it: whole percent, '–' when there is nothing to measure."""
    return "–" if share is None else f"{round(share * 100)}%"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class ShareFigure:
    """The mean, lowest and highest share of the next prompt kept, over some request pairs."""

    mean: float
    low: float
    high: float
    pairs: int
    conversations: int

    @property
    def text(self) -> str:
        return percent(self.mean)

    @property
    def span(self) -> str:
        """'12%–45%', or one figure when every pair keeps the same share."""
        low, high = percent(self.low), percent(self.high)
        return low if low == high else f"{low}–{high}"

    @property
    def over(self) -> str:
        """What the mean is taken over, in words: 'over 6 request pairs in 3 conversations'."""
        return (
            f"over {_plural(self.pairs, 'request pair')} in "
            f"{_plural(self.conversations, 'conversation')}"
        )

    @property
    def over_breaks(self) -> str:
        """The same, for a figure over the pairs that break (the summary's)."""
        if self.pairs == 1:
            return "the one request pair that breaks"
        return f"the mean over the {self.pairs} request pairs that break"


def share_figure(pairs: Iterable[RequestPair]) -> ShareFigure | None:
    """The figure over these pairs; None when there are none (nothing rendered twice)."""
    chosen: Sequence[RequestPair] = list(pairs)
    if not chosen:
        return None
    shares = [p.reusable_share for p in chosen]
    return ShareFigure(
        mean=round(sum(shares) / len(shares), 4),
        low=min(shares),
        high=max(shares),
        pairs=len(chosen),
        conversations=len({p.session for p in chosen}),
    )


def setting_figure(sessions: Iterable[SessionResult]) -> ShareFigure | None:
    """A setting's figure: every request pair of every conversation it rendered."""
    return share_figure(p for s in sessions for p in s.pairs)


def broken_pairs(sessions: Iterable[SessionResult]) -> list[RequestPair]:
    """The pairs whose next prompt does not start with the previous one."""
    return [p for s in sessions for p in s.pairs if p.status == "fail"]
