"""The built-in tiny-program model: tiny-arith's character-level Llama, pretrained on AZR's program world.

It reads and writes the compact formats of :mod:`coevolve.tasks.program`: proposing deduction and abduction tasks
from reference triplets, proposing inputs and a message for a program (induction), and solving the three task types.
Built like tiny-arith (:func:`coevolve.models.tiny_arith.ensure_built`: deterministic, cached under
``$COEVOLVE_CACHE/models/tiny-program-<fingerprint>``, a few minutes on 2 CPU cores) and with its own name, so
``tiny-arith`` and every experiment on it are unchanged.

Pretraining mixture (programs of 1-3 operations, inputs 0-9, held-out programs excluded): solving and proposing each
task type, a sixth each; a proposal's references are 0 to ``max_references`` random triplets. As with tiny-arith, it
is meant to be only partly competent: a share ``bare_answer_rate`` (60%) of the multi-step deduction solutions and of
the abduction solutions give the bare answer without the worked trace or search, so the model often answers at once
and wrongly, while it still writes the worked form in some samples; a reward for correct answers can teach it to use
it.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from coevolve.models.tiny_arith import BUILD_VERSION, ensure_built
from coevolve.rollout.base import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import program
from coevolve.tasks.triplets import KINDS

MIXTURE = tuple((f"{action}_{kind}", 1 / 6) for action in ("solve", "propose") for kind in KINDS)


@dataclass(frozen=True)
class TinyProgramBuild:
    """Settings of one tiny-program build (tiny-arith's model shape and optimisation); the cache folder name is a
    hash of them and of the program world's format version."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    steps: int = 6000
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    max_references: int = 6  # K of the proposer prompts: 0..max_references reference lines
    bare_answer_rate: float = 0.6  # multi-step deduction and all abduction solutions without their worked form
    eval_n: int = 200  # held-out tasks per type in the build report
    threads: int = 1  # torch threads while training (0: one per core); the weights depend on it

    corpus = "tiny-program"

    @classmethod
    def default(cls) -> TinyProgramBuild:
        """The real model (about 1.05M parameters, a few minutes on 2 cores)."""
        return cls()

    @classmethod
    def for_tests(cls) -> TinyProgramBuild:
        """A much weaker model that builds in about a minute; enough to emit the formats."""
        return cls(hidden=64, layers=2, heads=2, intermediate=128, steps=500, lr=3e-3, warmup=20, eval_n=20,
                   bare_answer_rate=0.0, max_references=2)

    def fingerprint(self) -> str:
        payload = json.dumps({**asdict(self), "format": program.FORMAT_VERSION, "build": BUILD_VERSION},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """One (prompt, completion) pair of the pretraining mixture."""
        part = rng.choices([k for k, _ in MIXTURE], weights=[w for _, w in MIXTURE])[0]
        action, _, kind = part.partition("_")
        level = rng.choice(program.LEVELS)
        exclude = program.held_out_programs()
        task = program.random_triplet(kind, level, rng, exclude=exclude)
        if action == "solve":
            worked = not (kind == "abduction" or level >= 2) or rng.random() >= self.bare_answer_rate
            return program.solver_prompt(kind, task), program.solve_completion(kind, task, worked)
        if kind == "induction":
            shown = program.random_triplet("deduction", rng.choice(program.LEVELS), rng, exclude=exclude)
            task = program.make_triplet(shown.program, [int(i) for i in task.inputs], program.message_of(shown.program))
            return program.proposer_prompt(kind, [shown]), program.proposal_completion(kind, task)
        references = [program.random_triplet(rng.choice(KINDS[:2]), rng.choice(program.LEVELS), rng, exclude=exclude)
                      for _ in range(rng.randint(0, self.max_references))]
        return program.proposer_prompt(kind, references), program.proposal_completion(kind, task)

    def report(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> dict:
        """Greedy accuracy per task type on the held-out sets, and the share of valid proposals per type."""
        return {"accuracy": task_accuracy(model, tokenizer, self.eval_n),
                "valid_proposal_rate": valid_proposal_rate(model, tokenizer, self.eval_n),
                "format_version": program.FORMAT_VERSION, "build_version": BUILD_VERSION}


def task_accuracy(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int = 200) -> dict[str, float]:
    """Greedy accuracy per task type on the first ``n`` held-out tasks of each."""
    tasks = [t for kind in KINDS for t in program.held_out_tasks(kind, n)]
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    outputs = engine.generate([program.solver_prompt(t.kind, t.triplet) for t in tasks],
                              SamplingParams(temperature=0.0, max_new_tokens=96), seed=0)
    correct = dict.fromkeys(KINDS, 0)
    for output, t in zip(outputs, tasks):
        correct[t.kind] += program.check(t.kind, t.triplet, program.read_answer(t.kind, output.text))
    return {kind: correct[kind] / max(1, n) for kind in KINDS}


def valid_proposal_rate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int = 200
                        ) -> dict[str, float]:
    """Share of proposals (temperature 1, from the seed triplet as the only reference) that are valid tasks."""
    world = program.TinyProgramWorld()
    seed = world.seed_triplet()
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    rates = {}
    for kind in KINDS:
        outputs = engine.generate([program.proposer_prompt(kind, [seed])] * n,
                                  SamplingParams(temperature=1.0, max_new_tokens=64), seed=0)
        proposals = [world.read_proposal(kind, o.text, seed.program) for o in outputs]
        valid = world.validate([p for p in proposals if not isinstance(p, str)])
        rates[kind] = sum(v.triplet is not None for v in valid) / max(1, n)
    return rates


def ensure_tiny_program(cache_dir: Path | None = None, build: TinyProgramBuild | None = None,
                        progress: bool = True) -> Path:
    """The folder of the tiny-program model for ``build`` (default settings), building it on first use."""
    return ensure_built(build or TinyProgramBuild.default(), cache_dir, progress)
