"""The one guard for parsers of model-written text, and counts of the bounds that parsing and voting hit.

Model text is data: whatever a model writes, a parser of it (JSON, regexes, tags, boxed answers) must return a value
or its "invalid" value, never raise and never take long. :func:`parses_model_text` makes that hold for a parser: a
text longer than ``MAX_TEXT_CHARS`` (or not a string) and any exception the parser raises (a ``RecursionError`` from
deeply nested JSON, a ``ValueError`` from a 5,000-digit integer) give its invalid value. The parsers themselves run in
linear time, so the length cap bounds their work. Each bound hit is counted; the training loop adds
:func:`pop_bound_counts` to every step's and evaluation's metrics row.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 65_536  # 16 K tokens of about 4 characters; longer model text is an invalid output
TEXT_TOO_LONG = "bounds/text_too_long"
PARSE_ERROR = "bounds/parse_errors"
VOTE_OVER_BUDGET = "bounds/vote_over_budget"

_counts = dict.fromkeys((TEXT_TOO_LONG, PARSE_ERROR, VOTE_OVER_BUDGET), 0)
_warned: set[tuple[str, str]] = set()
Parser = TypeVar("Parser", bound=Callable[..., Any])


def parses_model_text(invalid: Any = None) -> Callable[[Parser], Parser]:
    """Decorate a parser whose first argument is model text: a non-string, an over-long text or any exception
    gives ``invalid``."""

    def decorate(parse: Parser) -> Parser:
        @functools.wraps(parse)
        def guarded(text: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(text, str):
                return invalid
            if len(text) > MAX_TEXT_CHARS:
                count_bound(TEXT_TOO_LONG)
                return invalid
            try:
                return parse(text, *args, **kwargs)
            except Exception as exc:  # model text is data: whatever it makes a parser raise, the output is invalid
                count_bound(PARSE_ERROR)
                if (parse.__qualname__, type(exc).__name__) not in _warned:
                    _warned.add((parse.__qualname__, type(exc).__name__))
                    log.warning("%s raised %s on model text; counted as an invalid output (%s)",
                                parse.__qualname__, type(exc).__name__, PARSE_ERROR)
                return invalid

        return guarded  # type: ignore[return-value]

    return decorate


def count_bound(name: str) -> None:
    """Count one hit of the bound ``name`` (one of the ``bounds/*`` metric names)."""
    _counts[name] += 1


def pop_bound_counts() -> dict[str, float]:
    """Hits of each bound since the last call (``bounds/text_too_long``, ``bounds/parse_errors``,
    ``bounds/vote_over_budget``), then reset them."""
    counts = {name: float(n) for name, n in _counts.items()}
    _counts.update(dict.fromkeys(_counts, 0))
    return counts
