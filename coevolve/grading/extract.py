"""Final-answer extraction from model completions, and the linear tag scan the recipes' parsers share.

Every function takes arbitrary (possibly hostile) text and runs in linear time: searches are literal
``rfind`` calls or regexes without nested or adjacent ambiguous quantifiers, and the only pattern that
inspects free text around a keyword does so inside a bounded window. The extractors are guarded
(:func:`coevolve.grading.guard.parses_model_text`): over-long text or any exception gives None.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .guard import parses_model_text

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A backslash escapes the next character (so "\{" and "\}" are not grouping braces, "\\{" is).
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
_BRACE_DEPTH = {"{": 1, "}": -1}
# Lenient numbers; each alternative is linear (digit runs, at most one optional group each).
_NUMBER = re.compile(
    r"(?:(?<![0-9A-Za-z)\]}])(?<![0-9A-Za-z)\]}] )[-\u2212])?"  # a sign, unless the minus is binary
    r"(?:\\[dt]?frac\{[0-9]+\}\{[0-9]+\}"
    r"|[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])(?:\.[0-9]+)?"
    r"|[0-9]+(?:\.[0-9]+|/[0-9]+)?"
    r"|\.[0-9]+)"
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")

_ANSWER_IS = re.compile(r"answer(?:\s+is\b|\s*:)", re.IGNORECASE)
_ANSWER_WORD = re.compile(r"answer", re.IGNORECASE)
_WINDOW = 64  # characters after the word "answer" searched for a choice letter
_LETTER_AFTER_ANSWER = re.compile(
    r"(?:\s+is\b|\s*:)[\s:*]*(?:(?i:option|choice)\b\s*)?[(\[*$]*([A-Z])(?![A-Za-z0-9])"
)
_LETTER_HEAD = re.compile(r"[(\[]?([A-Za-z])(?=[)\].:\s]|$)")
_LONE_LETTER = re.compile(r"[(\[*$]*([A-Z])[)\].:*$]*")
_PARENTHESISED_LETTER = re.compile(r"\(([A-Z])\)")


@parses_model_text()
def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{..}`` / ``\\boxed {..}`` / ``\\fbox{..}``, braces matched.

    Returns None when there is no box, when the last box is never closed, or when it is empty.
    """
    box = _last_box(text)
    return box[0] if box else None


@parses_model_text()
def extract_lenient(text: str) -> str | None:
    """The last number or expression in the text: whichever ends last of the last number and the last non-empty
    ``\\boxed{}`` content (so a boxed ``\\frac{1}{2}`` is taken whole, and a number written after a box wins).

    A number is an integer, a decimal, ``a/b``, ``\\frac{a}{b}`` (also ``\\dfrac``/``\\tfrac``) or a
    thousands-separated integer (returned without its commas), with a sign unless the minus follows a digit,
    letter or closing bracket, or one of them and a space (``7-5`` and ``7 - 5`` give ``5``); ASCII digits only. None
    when the text has neither.
    """
    box = _last_box(text)
    number = _last_match(_NUMBER, text)
    if number is None or (box is not None and box[1] > number.start()):
        return box[0] if box else None
    value = number.group().replace(",", "")
    return "-" + value[1:] if value.startswith("\u2212") else value


def braces_balanced(text: str) -> bool:
    """Whether every ``{`` has a matching later ``}`` (LaTeX-escaped ``\\{`` and ``\\}`` ignored)."""
    depth = 0
    for token in _BRACE_TOKEN.finditer(text):
        depth += _BRACE_DEPTH.get(token.group(), 0)
        if depth < 0:
            return False
    return depth == 0


def unwrap_text(text: str) -> str:
    """Replace each ``\\text{..}`` (also ``\\textbf``, ``\\mathrm``, ``\\mathbf``) by its brace-free content."""
    return _TEXT_WRAPPER.sub(r"\1", text)


@parses_model_text()
def extract_hash_answer(text: str) -> str | None:
    """GSM8K-style answer after the last ``####``, without commas, whitespace or a trailing period."""
    start = text.rfind("####")
    if start < 0:
        return None
    return _rest_of_line(text, start + 4).replace(",", "").strip().rstrip(".").strip() or None


@parses_model_text()
def extract_tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` pair (case-sensitive), stripped; None if absent or empty."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    end = text.rfind(close_tag)
    if end < 0:
        return None
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None
    return text[start + len(open_tag) : end].strip() or None


@parses_model_text()
def extract_prefixed(text: str, prefix: str = "A:") -> str | None:
    """Value after ``prefix`` on the last line that starts with it (leading spaces ignored)."""
    last = _last_match(re.compile(r"^[^\S\n]*" + re.escape(prefix), re.MULTILINE), text)
    if last is None:
        return None
    return _rest_of_line(text, last.end()).strip() or None


@parses_model_text()
def extract_answer_phrase(text: str) -> str | None:
    """Value after the last "answer is" / "answer:", up to the end of its sentence or line."""
    last = _last_match(_ANSWER_IS, text)
    if last is None:
        return None
    sentence = _rest_of_line(text, last.end()).split(". ", 1)[0]
    return sentence.strip(" \t*:$").rstrip(".").strip(" \t*$") or None


def extract_choice(text: str, n_choices: int = 10) -> str | None:
    """Multiple-choice letter (upper case, one of the first ``n_choices`` letters) or None.

    Looked for, in order: ``\\boxed{C}`` (also ``\\boxed{\\text{C}}``, ``\\boxed{(c)}``),
    ``<answer>C</answer>``, "the answer is (C)" / "Answer: C", a last line holding only a letter, and the
    last "(C)" in the text.
    Free text only yields upper-case letters; explicit answer slots (box, tag) also accept lower case.
    """
    if not 1 <= n_choices <= 26:
        raise ValueError(f"n_choices must be in 1..26, got {n_choices}")
    return _extract_choice(text, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n_choices])


def extract_answer(text: str, kind: str = "math", n_choices: int = 10) -> str | None:
    """Final answer of a completion; never raises on any ``text`` (non-strings give None).

    kind "math": ``\\boxed{}``, then ``<answer>``, then ``####``, then an ``A:`` line, then "the answer is X".
    kind "mcq": :func:`extract_choice`.
    """
    if kind not in ("math", "mcq"):
        raise ValueError(f"unknown answer kind {kind!r}; expected 'math' or 'mcq'")
    if kind == "mcq":
        return extract_choice(text, n_choices)
    return _extract_math(text)


def tag_blocks(text: str, tag: str, ignore_case: bool = False) -> Iterator[tuple[int, int, int, int]]:
    """(block start, content start, content end, block end) of each ``<tag>..</tag>`` block, as
    ``re.finditer(r"<tag>(.*?)</tag>", re.DOTALL)`` finds them, in linear time (that regex is quadratic on many
    opening tags without a closing one)."""
    flags = re.IGNORECASE if ignore_case else 0
    opening, closing = re.compile(re.escape(f"<{tag}>"), flags), re.compile(re.escape(f"</{tag}>"), flags)
    pos = 0
    while (start := opening.search(text, pos)) and (end := closing.search(text, start.end())):
        yield start.start(), start.end(), end.start(), end.end()
        pos = end.end()


@parses_model_text()
def _extract_choice(text: str, letters: str) -> str | None:
    for slot in (extract_boxed(text), extract_tagged(text)):
        letter = _slot_letter(slot, letters) if slot is not None else None
        if letter:
            return letter
    for find in (_answer_phrase_letter, _lone_letter, _parenthesised_letter):
        letter = find(text, letters)
        if letter:
            return letter
    return None


@parses_model_text()
def _extract_math(text: str) -> str | None:
    for extractor in (extract_boxed, extract_tagged, extract_hash_answer, extract_prefixed, extract_answer_phrase):
        answer = extractor(text)
        if answer is not None:
            return answer
    return None


def _last_box(text: str) -> tuple[str, int] | None:
    """(stripped content, end) of the last closed, non-empty box; None if there is none."""
    last = _last_match(_BOX_OPEN, text)
    if last is None:
        return None
    depth = 0
    for token in _BRACE_TOKEN.finditer(text, last.end() - 1):
        depth += _BRACE_DEPTH.get(token.group(), 0)
        if depth == 0:
            content = text[last.end() : token.start()].strip()
            return (content, token.end()) if content else None
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 (keeps the final match)
        pass
    return last


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)]


def _slot_letter(slot: str, letters: str) -> str | None:
    """A choice letter at the start of an explicit answer slot such as a box's content."""
    slot = unwrap_text(slot).strip(" $*")
    match = _LETTER_HEAD.match(slot)
    letter = match.group(1).upper() if match else None
    return letter if letter and letter in letters else None


def _answer_phrase_letter(text: str, letters: str) -> str | None:
    """Letter in "answer is C" / "Answer: (C)", trying occurrences of "answer" from the last one back."""
    for word in reversed(list(_ANSWER_WORD.finditer(text))):
        match = _LETTER_AFTER_ANSWER.match(text[word.end() : word.end() + _WINDOW])
        if match and match.group(1) in letters:
            return match.group(1)
    return None


def _lone_letter(text: str, letters: str) -> str | None:
    """Letter when the last non-empty line is nothing but a letter (with optional brackets/punctuation)."""
    text = text.rstrip()
    last_line = text[text.rfind("\n") + 1 :].strip()
    match = _LONE_LETTER.fullmatch(last_line)
    return match.group(1) if match and match.group(1) in letters else None


def _parenthesised_letter(text: str, letters: str) -> str | None:
    """The last "(C)" in the text whose letter is in range."""
    found = None
    for match in _PARENTHESISED_LETTER.finditer(text):
        if match.group(1) in letters:
            found = match.group(1)
    return found
