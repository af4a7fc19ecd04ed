"""The built-in tiny-calc model: tiny-arith's character-level Llama, pretrained on the arithmetic world with some
worked answers that call the python tool (issue 45's world where the tool matters, on the CPU).

Its corpus is tiny-arith's mixture (:mod:`coevolve.models.tiny_arith`: solving, grounded solving and question
writing) over levels 1..``max_level`` (6: operands up to 20, values in the millions, far beyond what a 1M-parameter
model computes in its head), except that a share ``tool_rate[level - 1]`` of the solve samples of each level is a tool
trace in exactly the episode syntax of ``docs/tools.md``::

    Q:(7+12)*15-3*9=?                       <- the prompt
    ```python                               <- the completion: the model copies the question into print(...)
    print((7+12)*15-3*9)
    ```
    ```output                               <- an episode's turn stops here; the tool appends the observation
    258
    ```
    A:258                                   <- the model copies the output into its answer

(a grounded question's code first assigns the fact sheet's variables, one per line). The observation is the tool's
text, not the model's: the pretraining loss leaves it out, as the RL trainer does. The rates grow with the level
(25, 35, 50, 50, 50, 50%); the default build's greedy decoding still always answers in its head (and so is wrong from
level 2 on: 19, 9, 1, 2, 0, 0% at levels 1-6), while sampling at temperature 1 calls the tool in 9-28% of the
problems, and those episodes copy the question well enough to be right 40-87% of the time (in-head samples: 0-14%):
a reward for correct answers has something to teach, using the tool where it helps. A smaller model than
tiny-arith's (0.14M parameters, 2 layers) with more steps: builds of 0.45M parameters and 1,800-2,200 steps never
learned to copy the question into the call. Built like tiny-arith
(:func:`coevolve.models.tiny_arith.ensure_built`: deterministic, cached under
``$COEVOLVE_CACHE/models/tiny-calc-<fingerprint>``); ``build_info.json`` reports per level the greedy accuracy without
and with tool execution and the greedy and sampled tool-call rates.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from coevolve.execution import Executor, SandboxUnavailable
from coevolve.models.tiny_arith import BUILD_VERSION, MIXTURE, ensure_built, valid_question_rate
from coevolve.rollout.base import Completion, SamplingParams
from coevolve.rollout.episodes import CODE_CLOSE, CODE_OPEN, TOOL_CALL_STOP, TOOL_LIMITS, EpisodeEngine, python_tool
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import arith

CALC_VERSION = 1  # bump when the tool traces change what a build produces


@dataclass(frozen=True)
class TinyCalcBuild:
    """Settings of one tiny-calc build; the cache folder name is a hash of them."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    steps: int = 5000
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    max_level: int = 6
    bare_answer_rate: float = 0.6  # in-head solve samples of level >= 2 that give only ``A:<n>`` (no trace)
    tool_rate: tuple[float, ...] = (0.25, 0.35, 0.5, 0.5, 0.5, 0.5)  # solve samples of level l that call the tool
    eval_n: int = 100  # held-out problems per level in the build report
    threads: int = 1  # torch threads while training (0: one per core); the weights depend on it

    corpus = "tiny-calc"

    @classmethod
    def default(cls) -> TinyCalcBuild:
        """The real model (0.14M parameters, 5,000 steps: 7.4 minutes on one busy core)."""
        return cls()

    @classmethod
    def for_tests(cls) -> TinyCalcBuild:
        """A much weaker model that builds in about 20 seconds (tiny-arith's test size) and calls the tool in most
        episodes: every solve sample of its corpus is a tool trace. It copies questions into its calls badly (its
        answers are wrong), but its episodes run real sandboxed calls (tests of a kill during one)."""
        return cls(hidden=64, layers=2, heads=2, intermediate=128, steps=400, lr=3e-3, warmup=20, eval_n=8,
                   bare_answer_rate=0.0, tool_rate=(1.0,) * 6)

    def fingerprint(self) -> str:
        """Short hash of the settings and the format and build-code versions."""
        payload = json.dumps({**asdict(self), "format": arith.FORMAT_VERSION, "build": BUILD_VERSION,
                              "calc": CALC_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """One (prompt, completion) pair of the pretraining mixture."""
        kind = rng.choices([k for k, _ in MIXTURE], weights=[w for _, w in MIXTURE])[0]
        level = rng.randint(1, self.max_level)
        problem = arith.sample_problems(1, rng, levels=(level,), grounded=kind.endswith("grounded"))[0]
        if kind.startswith("solve"):
            prompt = arith.solver_prompt(problem.question, problem.doc)
            if rng.random() < self.tool_rate[level - 1]:
                return prompt, tool_trace(problem)
            bare = level >= 2 and rng.random() < self.bare_answer_rate
            return prompt, f"A:{problem.answer}" if bare else arith.solve_completion(problem)
        examples: list[str] = []
        if kind == "write_examples":
            near = [max(1, min(self.max_level, level + d)) for d in rng.choices((-1, 0, 0, 1), k=rng.randint(1, 4))]
            examples = [arith.sample_problems(1, rng, levels=(lv,))[0].question for lv in near]
        return arith.question_prompt(examples=examples, doc=problem.doc), arith.question_completion(problem)

    def report(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> dict:
        """Per level: greedy accuracy without the tool (single turns) and with it (episodes run in the sandbox), the
        greedy and sampled (temperature 1) tool-call rates; and the share of valid written questions."""
        return {**tool_report(model, tokenizer, self.eval_n, tuple(range(1, self.max_level + 1))),
                "valid_question_rate": valid_question_rate(model, tokenizer, self.eval_n),
                "format_version": arith.FORMAT_VERSION, "build_version": BUILD_VERSION}


def tool_trace(problem: arith.ArithProblem) -> str:
    """The worked answer of ``problem`` that calls the python tool (the module docstring's form)."""
    assignments = "".join(f"{binding}\n" for binding in problem.doc.split(",")) if problem.doc else ""
    code = f"{assignments}print({problem.question})"
    return f"{CODE_OPEN}\n{code}\n{CODE_CLOSE}\n{TOOL_CALL_STOP}\n{problem.answer}\n{CODE_CLOSE}\nA:{problem.answer}"


def tool_report(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int,
                levels: tuple[int, ...]) -> dict:
    """Greedy accuracy per level on the first ``n`` held-out problems, without and with tool execution, and the share
    of episodes that called the tool (greedy, and sampled at temperature 1); the tool's numbers are None where the
    sandbox cannot run (``tool_unavailable`` says why)."""
    problems = [p for level in levels for p in arith.held_out(level, n)]
    prompts = [arith.solver_prompt(p.question, p.doc) for p in problems]
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=64 + 16 * max(levels))

    def per_level(flags: list[float]) -> dict[int, float]:
        return {level: sum(f for f, p in zip(flags, problems) if p.level == level) / max(1, n) for level in levels}

    def correct(outputs: list[Completion]) -> list[float]:
        return [float(arith.parse_answer(o.written_text) == str(p.answer)) for o, p in zip(outputs, problems)]

    report: dict = {"accuracy": per_level(correct(engine.generate(prompts, greedy, seed=0)))}
    try:
        executor = Executor(TOOL_LIMITS)
    except SandboxUnavailable as exc:
        return {**report, "accuracy_with_tool": None, "tool_call_rate": None, "tool_call_rate_sampled": None,
                "tool_unavailable": str(exc)}
    with executor:
        episodes = EpisodeEngine(engine, tokenizer, python_tool(executor), max_tool_calls=2)
        ran = episodes.generate(prompts, greedy, seed=0)
        sampled = episodes.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=greedy.max_new_tokens),
                                    seed=0)
    return {**report, "accuracy_with_tool": per_level(correct(ran)),
            "tool_call_rate": per_level([float(o.tool_calls > 0) for o in ran]),
            "tool_call_rate_sampled": per_level([float(o.tool_calls > 0) for o in sampled])}


def ensure_tiny_calc(cache_dir: Path | None = None, build: TinyCalcBuild | None = None,
                     progress: bool = True) -> Path:
    """The folder of the tiny-calc model for ``build`` (default settings), building it on first use."""
    return ensure_built(build or TinyCalcBuild.default(), cache_dir, progress)
