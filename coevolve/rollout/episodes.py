"""Episodes: multi-turn sampling with a sandboxed Python tool, one shared loop below every engine.

The syntax (Agent0's executor and verl-tool's python tool: ``action_stop_tokens='```output'``)::

    ...the model reasons, then writes
    ```python
    print(123456789 * 987654321)
    ```
    ```output                       <- the model's last tokens of the turn: generation stops at "```output"
    121932631112635269              <- the observation, appended by the rollout layer (tool tokens, masked)
    ```
    ...the model goes on

A turn is one ``generate`` call of the wrapped engine on the prompt plus the episode so far (re-prefill), so the HF
plain loop, its static decoder and vLLM all run the same episode. The code of a call is the text between the last
```` ```python```` before ``"```output"`` and the closing fence. Every row's pending code of a turn runs in one call
of the executor's worker pool, in parallel. The observation is ``"\\n" + output + "\\n```\\n"``: the printed output
(stdout and stderr, trailing newlines dropped, cut to ``OBSERVATION_CHARS`` with a note of how much was cut), and for
a failure a last line ``"error: <Exception>: <message>"`` (or ``"error: <kind>: <detail>"`` for the sandbox's
failure kinds: timeout, forbidden, output, killed).

The token budget: ``max_new_tokens`` counts the model's AND the observations' tokens of an episode (verl-tool's
``max_response_length`` holds the whole response, observations included); an observation that does not fit is cut
and ends the episode (``"length"``). An episode ends at EOS, a stop string of ``params.stop``, the budget, or when
the model asks for tool call ``max_tool_calls + 1`` (``"tool_limit"``, not run, counted as capped).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from coevolve.distributed import all_gather_objects, shard_bounds, world_size
from coevolve.execution import ExecutionLimits, Executor, Job, Outcome
from coevolve.rollout.base import Completion, RolloutEngine, SamplingParams

TOOL_CALL_STOP = "```output"  # the model ends a tool call with this line; the sampler stops there
CODE_OPEN = "```python"
CODE_CLOSE = "```"
OBSERVATION_CHARS = 1024  # an observation's characters at most (Agent0 keeps 512 observation tokens)
ERROR_CHARS = 300  # of them, the exception's line at most
TOOL_LIMITS = ExecutionLimits(cpu_seconds=5, wall_seconds=10)  # per call: a loop costs the batch 10 s at most
TURN_SEED_STRIDE = 7_919  # turn r of an episode call with seed s samples with seed s + r * TURN_SEED_STRIDE

# Run inside the sandbox (coevolve.execution): exec the model's code with stdout and stderr captured up to a cap, and
# return (kept text, characters printed, the exception as one line or None) as the expression's value.
HARNESS = '''
import sys


class _Capture:
    def __init__(self, cap):
        self.cap, self.parts, self.kept, self.total = cap, [], 0, 0

    def write(self, text):
        text = str(text)
        self.total += len(text)
        if self.kept < self.cap:
            self.parts.append(text[:self.cap - self.kept])
            self.kept += len(self.parts[-1])
        return len(text)

    def flush(self):
        pass


def _run_tool(source, cap):
    capture = _Capture(cap)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = capture
    error = None
    try:
        exec(compile(source, "<tool>", "exec"), {"__name__": "__main__"})
    except BaseException as exc:
        try:
            error = (type(exc).__name__ + ": " + str(exc))[:cap]
        except BaseException:
            error = type(exc).__name__
    finally:
        sys.stdout, sys.stderr = saved
    return "".join(capture.parts), capture.total, error
'''


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave: ``output`` (printed text, already cut) and ``status``: "ok", "error" (an exception
    in the code), or the executor's failure kind ("timeout", "memory", "forbidden", "output", "syntax", "killed")."""

    output: str
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


ToolRunner = Callable[[Sequence[str]], list[ToolResult]]


def python_tool(executor: Executor) -> ToolRunner:
    """The python tool on a :class:`coevolve.execution.Executor`: every code of a turn in one ``executor.run``."""

    def run(codes: Sequence[str]) -> list[ToolResult]:
        jobs = [Job(HARNESS, f"_run_tool({code!r}, {OBSERVATION_CHARS})") for code in codes]
        return [_tool_result(outcome) for outcome in executor.run(jobs)] if jobs else []

    return run


def _tool_result(outcome: Outcome) -> ToolResult:
    """A ToolResult from an executor Outcome; the value is parsed as a literal (data, never run here)."""
    if not outcome.ok:
        return ToolResult(f"error: {outcome.status}: {outcome.detail}", outcome.status)
    try:
        parsed = ast.literal_eval(outcome.value or "")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        parsed = None
    if not (isinstance(parsed, tuple) and len(parsed) == 3 and isinstance(parsed[0], str)
            and isinstance(parsed[1], int) and isinstance(parsed[2], (str, type(None)))):
        # a program that tampered with its harness: its own observation says so
        return ToolResult("error: killed: the tool's result could not be read", "killed")
    printed, total, error = parsed
    printed_text = clean_text(printed).rstrip("\n")
    note = f"\n... ({total - len(printed)} more characters)" if total > len(printed) else ""
    failure = f"error: {clean_text(error)[:ERROR_CHARS]}" if error is not None else ""
    text = printed_text[:OBSERVATION_CHARS - len(note) - len(failure) - 1] + note
    text = "\n".join(part for part in (text, failure) if part)
    return ToolResult(text, "error" if error is not None else "ok")


def clean_text(text: str) -> str:
    """``text`` as valid UTF-8 (lone surrogates replaced)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def tool_code(text: str) -> str | None:
    """The code of the tool call that ``text`` ends with (up to its last ``"```output"``): what follows the last
    ```` ```python```` before it, less the closing fence; None when there is no ```` ```python```` block."""
    head = text[:text.rfind(TOOL_CALL_STOP)]
    start = head.rfind(CODE_OPEN)
    if start < 0:
        return None
    code = head[start + len(CODE_OPEN):].rstrip()
    if code.endswith(CODE_CLOSE):
        code = code[:-len(CODE_CLOSE)]
    return code.strip("\n")


def observation(result: ToolResult) -> str:
    """The exact text appended after a tool call."""
    return f"\n{result.output}\n{CODE_CLOSE}\n"


@dataclass
class _Episode:
    """One row's episode so far."""

    prompt: str
    prompt_ids: list[int] = field(default_factory=list)
    text: str = ""
    turn_text: str = ""  # the model's text of the last turn
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_mask: list[bool] = field(default_factory=list)
    observation_spans: list[tuple[int, int]] = field(default_factory=list)  # character ranges of ``text``
    finish_reason: str = "length"
    tool_calls: int = 0
    done: bool = False

    def add_turn(self, c: Completion) -> None:
        self.text += c.text
        self.turn_text = c.text
        self.tokens += c.token_ids
        self.logprobs += c.logprobs
        self.tool_mask += [False] * len(c.token_ids)
        self.finish_reason = c.finish_reason


class EpisodeEngine:
    """Samples episodes with ``engine`` and ``run_tool`` (:func:`python_tool`): the module docstring's loop.

    Rows continue independently: a turn samples only the rows still going, and runs all their tool calls in one
    ``run_tool`` call. ``tokenizer`` encodes observations (no special tokens); ``max_tool_calls``: calls per episode.
    """

    def __init__(self, engine: RolloutEngine, tokenizer, run_tool: ToolRunner, max_tool_calls: int):
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.inner, self.tokenizer, self.run_tool, self.max_tool_calls = engine, tokenizer, run_tool, max_tool_calls
        self._counts: dict[str, float] = {}

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        """One episode per prompt, as a Completion whose ``tool_mask`` marks the observations' tokens.

        Turn r samples the rows still going in one call (seed ``seed + r * TURN_SEED_STRIDE``) with the largest
        budget left among them; a row's turn is then cut to its own budget (the tokens it would have sampled with
        that budget: sampling is causal)."""
        turn_params = replace(params, stop=tuple(params.stop) + (TOOL_CALL_STOP,))
        episodes = [_Episode(p) for p in prompts]
        self._count("tool/episodes", len(prompts))
        for turn in range(self.max_tool_calls + 2):  # max_tool_calls calls, then one request that is capped
            going = [i for i, e in enumerate(episodes) if not e.done]
            if not going:
                break
            left = {i: params.max_new_tokens - len(episodes[i].tokens) for i in going}
            sampled = self.inner.generate([prompts[i] + episodes[i].text for i in going],
                                          replace(turn_params, max_new_tokens=max(left.values())),
                                          seed + turn * TURN_SEED_STRIDE)
            for i, c in zip(going, sampled):
                if turn == 0:
                    episodes[i].prompt_ids = c.prompt_ids
                if len(c.token_ids) > left[i]:
                    c = replace(c, token_ids=c.token_ids[:left[i]], logprobs=c.logprobs[:left[i]],
                                text=self.tokenizer.decode(c.token_ids[:left[i]], skip_special_tokens=True),
                                finish_reason="length")
                episodes[i].add_turn(c)
            calls = self._requests({i: episodes[i] for i in going}, params)
            self._run_calls(episodes, calls, params)
        return [Completion(prompt=e.prompt, prompt_ids=e.prompt_ids, token_ids=e.tokens, text=e.text,
                           logprobs=e.logprobs, finish_reason=e.finish_reason, tool_mask=e.tool_mask,
                           tool_calls=e.tool_calls, observation_spans=e.observation_spans) for e in episodes]

    def _requests(self, turned: dict[int, _Episode], params: SamplingParams) -> dict[int, str | None]:
        """Which rows of the turn asked for a tool call within the limit, with its code (None: no code block); the
        others are done."""
        calls: dict[int, str | None] = {}
        for i, e in turned.items():
            asked = e.finish_reason == "stop" and TOOL_CALL_STOP in e.turn_text
            if not asked:
                e.done = True
            elif len(e.tokens) >= params.max_new_tokens:
                e.done, e.finish_reason = True, "length"
            elif e.tool_calls >= self.max_tool_calls:
                e.done, e.finish_reason = True, "tool_limit"
                self._count("tool/capped_calls", 1)
            else:
                calls[i] = tool_code(e.turn_text)
        return calls

    def _run_calls(self, episodes: list[_Episode], calls: dict[int, str | None], params: SamplingParams) -> None:
        """Run the turn's tool calls in one batch and append each observation (cut to the token budget)."""
        codes = {i: code for i, code in calls.items() if code is not None}
        ran: dict[int, ToolResult] = {}
        if codes:
            start = time.perf_counter()
            ran = dict(zip(codes, self._run_shared(list(codes.values()))))
            self._count("time/tool_s", time.perf_counter() - start)
        for i in calls:
            result = ran.get(i) or ToolResult(f"error: syntax: no {CODE_OPEN} block before {TOOL_CALL_STOP}",
                                              "syntax")
            e = episodes[i]
            e.tool_calls += 1
            self._count("tool/calls", 1)
            self._count("tool/errors", 0 if result.ok else 1)
            self._count("tool/timeouts", 1 if result.status == "timeout" else 0)
            text = observation(result)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            room = params.max_new_tokens - len(e.tokens)
            if len(ids) >= room:
                ids = ids[:room]
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                e.done, e.finish_reason = True, "length"
            e.observation_spans.append((len(e.text), len(e.text) + len(text)))
            e.text += text
            e.tokens += ids
            e.logprobs += [0.0] * len(ids)  # a placeholder: the trainer masks tool tokens out
            e.tool_mask += [True] * len(ids)
            self._count("tool/observation_tokens", len(ids))

    def _run_shared(self, codes: list[str]) -> list[ToolResult]:
        """Run the calls; with several processes each rank runs its share and every rank gets every result, so all
        ranks append the same observations (a program that draws random numbers would otherwise split them)."""
        if world_size() == 1:
            return self.run_tool(codes)
        start, end = shard_bounds(len(codes))
        return [result for part in all_gather_objects(self.run_tool(codes[start:end])) for result in part]

    def _count(self, key: str, value: float) -> None:
        self._counts[key] = self._counts.get(key, 0.0) + value

    def pop_metrics(self) -> dict[str, float]:
        """The tool counts since the last call (the wrapped engine reports its own costs): episodes, calls, errors,
        timeouts, capped requests, observation tokens, seconds in the tool."""
        metrics, self._counts = self._counts, {}
        return metrics

    def release(self) -> None:
        if hasattr(self.inner, "release"):
            self.inner.release()


def tool_rates(counts: dict[str, float]) -> dict[str, float]:
    """Per-step tool telemetry from summed counts: calls and observation tokens per episode, error and timeout rates
    per call, the share of requests over the limit."""
    episodes, calls = counts.get("tool/episodes", 0.0), counts.get("tool/calls", 0.0)
    nan = float("nan")
    return {"tool/calls_per_episode": calls / episodes if episodes else nan,
            "tool/observation_tokens_per_episode": counts.get("tool/observation_tokens", 0.0) / episodes
            if episodes else nan,
            "tool/error_rate": counts.get("tool/errors", 0.0) / calls if calls else nan,
            "tool/timeout_rate": counts.get("tool/timeouts", 0.0) / calls if calls else nan}


def observation_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) character ranges of the observations in an episode's ``text``: what follows each
    ``"```output"`` up to and including the ``"\\n```\\n"`` that closes it (to the end of ``text`` if none does)."""
    spans: list[tuple[int, int]] = []
    at = text.find(TOOL_CALL_STOP)
    while at >= 0:
        start = at + len(TOOL_CALL_STOP)
        close = text.find(f"\n{CODE_CLOSE}\n", start + 1)
        end = len(text) if close < 0 else close + len(CODE_CLOSE) + 2
        spans.append((start, end))
        at = text.find(TOOL_CALL_STOP, end)
    return spans
