"""Dynamic RL's rule-based question filters (paper §2 "Question Filtering"; the regexes are ours).

A filtered question keeps its diversity rewards but gets R_q = 0 and R_s = 0 for all its solutions. The rules:

1. ``proof``: the word "prove" (``\\bprove``, any case): proofs cannot be majority-voted.
2. ``multi_part``: several sub-questions: two or more question marks; or, within one sentence, a request verb
   (find, determine, calculate, compute, what is, what are) later followed by "and" plus another request verb or
   "the"/"its" ("Find the area and the perimeter"); or an enumeration such as "1. ... 2." / "(a) ... (b)".
   ``broad=True`` takes the paper's "find ... and ..." literally (any "and" after "find" in a sentence), which also
   removes single-answer questions such as "Find the sum of 3 and 4".
3. ``leak``: the question already contains a solution: one of the exact, case-sensitive strings ``Solution:``,
   ``Answer:``, ``\\boxed{``, ``The final answer is``, ``To solve``, ``Let's break down``.
"""

from __future__ import annotations

import re

FILTER_RULES: tuple[str, ...] = ("proof", "multi_part", "leak")
LEAK_MARKERS: tuple[str, ...] = ("Solution:", "Answer:", "\\boxed{", "The final answer is", "To solve",
                                 "Let's break down")

_PROOF = re.compile(r"\bprove", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
_REQUEST = r"(?:find|determine|calculate|compute|what\s+is|what\s+are)"
# Each rule "A, later B" is two searches (B from where A ends) instead of one "A.*B" regex, which is quadratic in the
# occurrences of A: (request, the rest of its line up to the pairing "and").
_PAIRED_NARROW = (re.compile(rf"\b{_REQUEST}\b", re.IGNORECASE),
                  re.compile(rf"[^\n]*?\band\s+(?:{_REQUEST}|the|its)\b", re.IGNORECASE))
_PAIRED_BROAD = (re.compile(r"\bfind\b", re.IGNORECASE), re.compile(r"[^\n]*?\band\b", re.IGNORECASE))
_FIRST_PART = re.compile(r"(?:^|\s)(?:1[.)]|\(1\)|\(a\)|a\))\s", re.IGNORECASE)
_SECOND_PART = re.compile(r"\s(?:2[.)]|\(2\)|\(b\)|b\))\s", re.IGNORECASE)


def is_proof(question: str) -> bool:
    """Rule 1: asks for a proof."""
    return _PROOF.search(question) is not None


def is_multi_part(question: str, broad: bool = False) -> bool:
    """Rule 2: several question marks, paired requests in one sentence, or an enumeration of parts."""
    first = _FIRST_PART.search(question + " ")
    if question.count("?") >= 2 or (first and _SECOND_PART.search(question + " ", first.end())):
        return True
    request, pairing = _PAIRED_BROAD if broad else _PAIRED_NARROW
    return any(_paired(sentence, request, pairing) for sentence in _SENTENCE_END.split(question))


def _paired(sentence: str, request: re.Pattern[str], pairing: re.Pattern[str]) -> bool:
    """Whether a request is followed on its line by the pairing "and ..." (one pairing search per line)."""
    pos = 0
    while found := request.search(sentence, pos):
        if pairing.match(sentence, found.end()):
            return True
        pos = sentence.find("\n", found.end()) + 1
        if pos == 0:
            return False
    return False


def leaks_solution(question: str) -> bool:
    """Rule 3: contains one of ``LEAK_MARKERS``."""
    return any(marker in question for marker in LEAK_MARKERS)


def filter_reasons(question: str, broad_multi_part: bool = False) -> list[str]:
    """The rules of ``FILTER_RULES`` that ``question`` breaks (empty: it passes)."""
    verdicts = {"proof": is_proof(question), "multi_part": is_multi_part(question, broad_multi_part),
                "leak": leaks_solution(question)}
    return [rule for rule in FILTER_RULES if verdicts[rule]]
