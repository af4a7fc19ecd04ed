"""Answer grading: final-answer extraction, equivalence (math-verify behind a hard timeout), majority vote."""

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
    extract_prefixed,
    extract_tagged,
    unwrap_text,
)
from .vote import VoteResult, majority_vote

__all__ = [
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
    "extract_prefixed",
    "extract_tagged",
    "fast_equivalent",
    "majority_vote",
    "normalize_answer",
    "shutdown_worker",
    "unwrap_text",
    "verify_equivalent",
]
