"""Answer equivalence: an exact fast path, then math-verify in a separate worker process with a hard timeout.

Model text is data. In this process it is only normalised with regexes and, after a strict numeric regex
check, read by ``fractions.Fraction``; nothing is evaluated. Only the worker process (a fresh interpreter
running :func:`_serve`) hands text to math-verify, and only to its LaTeX parser: math-verify's
plain-expression parser calls sympy's ``parse_expr``, which uses ``eval``. A comparison that exceeds its
timeout kills the worker (and returns False); the next comparison starts a new one. Inside the worker,
resource limits cap memory and make a runaway comparison die on its own even if this process is gone.

The worker relies on waiting for pipes with ``selectors`` and on ``resource``: POSIX only (Linux, macOS).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import re
import selectors
import subprocess
import sys
import threading
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

from .extract import braces_balanced, unwrap_text

MAX_VERIFY_CHARS = 2000  # answers longer than this are decided by the fast path alone
_STARTUP_TIMEOUT_S = 60.0
_WORKER_MEMORY_BYTES = 4 << 30
_MAX_NUMBER_CHARS = 64  # int() of a digit string is quadratic in its length
# A fresh interpreter (no multiprocessing: it would re-run the caller's unguarded __main__ script) that
# imports this module from the directory holding the coevolve package.
_WORKER_COMMAND = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, sys.argv[1]); from {__name__} import _serve; _serve()",
    str(Path(__file__).resolve().parents[2]),
]

_NOISE = re.compile(r"\\(?:left|right)(?![A-Za-z])|\\[!,;: ]|[\s$]+")
_FRAC_ALIAS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_RATIO = re.compile(r"[+-]?\d+/\d+")
_LATEX_FRAC = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{(\d+)\}")


def normalize_answer(answer: str) -> str:
    """Canonical string form for exact comparison: no whitespace, ``$``, ``\\left``/``\\right``, thin spaces,
    ``\\text{}``-like wrappers, trailing periods, or thousands commas in plain numbers; ``\\dfrac`` and
    ``\\tfrac`` become ``\\frac``."""
    answer = _NOISE.sub("", unwrap_text(answer))
    answer = _FRAC_ALIAS.sub(r"\\frac", answer).replace("{,}", ",").rstrip(".")
    return answer.replace(",", "") if _THOUSANDS.fullmatch(answer) else answer


def fast_equivalent(pred: str | None, gold: str | None) -> bool | None:
    """Cheap exact verdict, or None when only math-verify can decide.

    False if either side is missing or empty; True if the normalised strings are equal or both are plain
    numbers (integer, decimal, ``a/b``, ``\\frac{a}{b}``) with the same exact value; False for two different
    integers.
    """
    if pred is None or gold is None:
        return False
    pred, gold = normalize_answer(pred), normalize_answer(gold)
    if not pred or not gold:
        return False
    if pred == gold:
        return True
    pred_value, gold_value = _as_number(pred), _as_number(gold)
    if pred_value is None or gold_value is None:
        return None
    if pred_value == gold_value:
        return True
    return False if pred_value.denominator == gold_value.denominator == 1 else None


def verify_equivalent(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """math-verify's verdict on ``pred`` against ``gold``, computed in the worker process.

    False on a timeout (the worker is killed), a worker crash, unparsable input, an answer longer than
    ``MAX_VERIFY_CHARS``, or unbalanced braces (which could break out of the ``\\boxed{}`` the answer is
    wrapped in). Results are cached per (pred, gold, timeout_s).
    """
    if not all(len(answer) <= MAX_VERIFY_CHARS and braces_balanced(answer) for answer in (pred, gold)):
        return False
    return _cached_verify(pred.strip(), gold.strip(), float(timeout_s))


def answers_equivalent(
    pred: str | None, gold: str | None, timeout_s: float = 5.0, use_math_verify: bool = True
) -> bool:
    """Whether ``pred`` is mathematically equivalent to ``gold``: the fast path, then (if undecided and
    ``use_math_verify``) math-verify with a hard per-call timeout."""
    verdict = fast_equivalent(pred, gold)
    if verdict is not None:
        return verdict
    return use_math_verify and verify_equivalent(pred, gold, timeout_s)


def batch_equivalent(
    pairs: Iterable[tuple[str | None, str | None]], timeout_s: float = 5.0, use_math_verify: bool = True
) -> list[bool]:
    """:func:`answers_equivalent` for each (pred, gold) pair; the timeout applies to each pair."""
    return [answers_equivalent(pred, gold, timeout_s, use_math_verify) for pred, gold in pairs]


def shutdown_worker() -> None:
    """Stop the math-verify worker process if it runs (it restarts on the next comparison)."""
    _WORKER.stop()


def _as_number(answer: str) -> Fraction | None:
    """Exact value of a normalised plain number, or None. Never evaluates anything."""
    if len(answer) > _MAX_NUMBER_CHARS:
        return None
    try:
        frac = _LATEX_FRAC.fullmatch(answer)
        if frac:
            value = Fraction(int(frac[2]), int(frac[3]))
            return -value if frac[1] == "-" else value
        if _DECIMAL.fullmatch(answer) or _RATIO.fullmatch(answer):
            return Fraction(answer)
    except ZeroDivisionError:
        return None
    return None


@functools.lru_cache(maxsize=8192)
def _cached_verify(pred: str, gold: str, timeout_s: float) -> bool:
    return _WORKER.verify(pred, gold, timeout_s)


class _Worker:
    """One math-verify process, started on first use and replaced as soon as it is killed (so the next one
    warms up while the caller does other work). Requests and replies are JSON lines on its stdin/stdout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._owner_pid = os.getpid()

    @property
    def pid(self) -> int | None:
        """Process id of the current worker, if any."""
        return self._proc.pid if self._proc is not None else None

    def verify(self, pred: str, gold: str, timeout_s: float) -> bool:
        """Send one comparison; on a timeout or a dead worker, replace the worker and return False."""
        with self._lock:
            proc = self._ensure_ready()
            try:
                proc.stdin.write(json.dumps([pred, gold, timeout_s]).encode() + b"\n")
                proc.stdin.flush()
                reply = _read_line(proc, timeout_s)
            except OSError:
                reply = None
            if reply is None:
                self._kill()
                self._spawn()
                return False
            return reply == b"1\n"

    def stop(self) -> None:
        with self._lock:
            self._kill()

    def _ensure_ready(self) -> subprocess.Popen[bytes]:
        if self._owner_pid != os.getpid():  # forked child: never share the parent's pipes
            self._proc, self._ready, self._owner_pid = None, False, os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            self._spawn()
        if not self._ready:
            if _read_line(self._proc, _STARTUP_TIMEOUT_S) != b"ready\n":
                self._kill()
                raise RuntimeError("the math-verify worker failed to start (is math-verify installed?)")
            self._ready = True
        return self._proc

    def _spawn(self) -> None:
        self._proc = subprocess.Popen(_WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._ready = False

    def _kill(self) -> None:
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait()
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._proc, self._ready = None, False


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
    """One line from the worker, or None on timeout or end of file."""
    with selectors.DefaultSelector() as selector:  # not select.select: it fails on descriptors >= 1024
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout_s)
    return (proc.stdout.readline() or None) if ready else None


_WORKER = _Worker()
atexit.register(shutdown_worker)


# ----------------------------------------------------------------------------------------------------------
# Worker side: runs in the child process only.


def _serve() -> None:
    """Worker main loop: read ``[pred, gold, timeout_s]`` lines, reply ``1`` or ``0`` per line."""
    import resource

    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library prints must not corrupt the replies
    from math_verify import LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # silences the "timeout disabled" warning
    _lower_soft_limit(resource.RLIMIT_AS, _WORKER_MEMORY_BYTES)
    _lower_soft_limit(resource.RLIMIT_CORE, 0)  # the CPU limit's SIGXCPU must not leave core files behind
    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def equivalent(pred: str, gold: str) -> bool:
        # Timeouts are disabled here (they are signal based); the parent process enforces them.
        gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=None)
        pred_parsed = parse("\\boxed{" + pred + "}", extraction_config=config, parsing_timeout=None)
        return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))

    equivalent("x+1", "1+x")  # pay sympy's first-call costs before the first timed request
    replies.write(b"ready\n")
    for line in sys.stdin.buffer:
        pred, gold, timeout_s = json.loads(line)
        _limit_cpu_seconds(timeout_s + 2.0)
        try:
            verdict = equivalent(pred, gold)
        except Exception:  # any failure inside math-verify or sympy means "not shown equivalent"
            verdict = False
        replies.write(b"1\n" if verdict else b"0\n")


def _limit_cpu_seconds(seconds: float) -> None:
    """Let the kernel kill this process (SIGXCPU) if the next request uses more than ``seconds`` of CPU,
    so a runaway comparison cannot outlive a parent that died without killing it."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    _lower_soft_limit(resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + seconds))


def _lower_soft_limit(limit: int, value: int) -> None:
    """Set a resource's soft limit to ``value``, or to its hard limit where that is lower."""
    import resource

    _, hard = resource.getrlimit(limit)
    resource.setrlimit(limit, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))
