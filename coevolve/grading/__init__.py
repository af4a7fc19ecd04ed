"""Answer grading: final-answer extraction, equivalence (math-verify behind a hard timeout), majority vote, and the
guard every parser of model text wears."""

from .equivalence import (
    MAX_VERIFY_CHARS,
    answers_equivalent,
    batch_equivalent,
    fast_equivalent,
    normalize_answer,
    shutdown_worker,
    verify_equivalent,
)
from .extract import (
    braces_balanced,
    extract_answer,
    extract_answer_phrase,
    extract_boxed,
    extract_choice,
    extract_hash_answer,
    extract_lenient,
    extract_prefixed,
    extract_tagged,
    tag_blocks,
    unwrap_text,
)
from .guard import MAX_TEXT_CHARS, parses_model_text, pop_bound_counts
from .vote import VoteResult, majority_vote

__all__ = [
    "MAX_TEXT_CHARS",
    "MAX_VERIFY_CHARS",
    "VoteResult",
    "answers_equivalent",
    "batch_equivalent",
    "braces_balanced",
    "extract_answer",
    "extract_answer_phrase",
    "extract_boxed",
    "extract_choice",
    "extract_hash_answer",
    "extract_lenient",
    "extract_prefixed",
    "extract_tagged",
    "fast_equivalent",
    "majority_vote",
    "normalize_answer",
    "parses_model_text",
    "pop_bound_counts",
    "shutdown_worker",
    "tag_blocks",
    "unwrap_text",
    "verify_equivalent",
]
