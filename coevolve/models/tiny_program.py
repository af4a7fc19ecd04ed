"""The built-in tiny-program model: tiny-arith's character-level Llama, pretrained on AZR's program world.

It reads and writes the compact formats of :mod:`coevolve.tasks.program`: proposing deduction and abduction tasks
from reference triplets, proposing inputs and a message for a program (induction), and solving the three task types.
Built like tiny-arith (:func:`coevolve.models.tiny_arith.ensure_built`: deterministic, cached under
``$COEVOLVE_CACHE/models/tiny-program-<fingerprint>``; the default build takes about 20 minutes on one CPU core)
and with its own name, so ``tiny-arith`` and every experiment on it are unchanged.

Pretraining mixture (programs of 1-3 operations, inputs 0-9, held-out programs and tasks left out:
:func:`coevolve.tasks.program.training_triplet`): solving each task type, a third of ``solve_share`` each, and
proposing each, a third of the rest; a proposal's references are 0 to ``max_references`` random triplets. As with
tiny-arith, it is meant to be only partly competent: a share ``bare_answer_rate`` (60%) of the multi-step deduction
solutions and of the abduction solutions give the bare answer without the worked trace or search, so the model often
answers at once and wrongly, while it still writes the worked form in some samples; a reward for correct answers can
teach it to use it.

The build of FORMAT_VERSION 1 (6,000 steps, half of the samples solving) could not copy a program into its trace:
forced to write the worked deduction it was right on 19% of held-out one-operation tasks, and no more often than with
the bare answer at two and three operations, so a reward for correct answers had nothing to select
(``experiments/azr/README.md``). This one (12,000 steps, 75% solving) writes the worked deduction right on 100%, 46%
and 21% of held-out tasks of 1, 2 and 3 operations against 46%, 27% and 9% for the bare answer (greedy, forced form).
Its abduction search is not better than a bare guess (73/52/33% against 79/57/41%).
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


@dataclass(frozen=True)
class TinyProgramBuild:
    """Settings of one tiny-program build (tiny-arith's model shape and optimisation); the cache folder name is a
    hash of them and of the program world's format version."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    steps: int = 12000
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    max_references: int = 6  # K of the proposer prompts: 0..max_references reference lines
    bare_answer_rate: float = 0.6  # multi-step deduction and all abduction solutions without their worked form
    solve_share: float = 0.75  # solving samples in the mixture (the rest propose), equal across the three task types
    eval_n: int = 200  # held-out tasks per type in the build report
    threads: int = 1  # torch threads while training (0: one per core); the weights depend on it

    corpus = "tiny-program"

    @classmethod
    def default(cls) -> TinyProgramBuild:
        """The real model (about 1.05M parameters; 1,162 s to build on one loaded core)."""
        return cls()

    @classmethod
    def for_tests(cls) -> TinyProgramBuild:
        """A much weaker model that builds in about a minute; enough to emit the formats."""
        return cls(hidden=64, layers=2, heads=2, intermediate=128, steps=500, lr=3e-3, warmup=20, eval_n=20,
                   bare_answer_rate=0.0, max_references=2, solve_share=0.5)

    def fingerprint(self) -> str:
        payload = json.dumps({**asdict(self), "format": program.FORMAT_VERSION, "build": BUILD_VERSION},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """One (prompt, completion) pair of the pretraining mixture."""
        solving = rng.random() < self.solve_share
        kind = rng.choice(KINDS)
        level = rng.choice(program.LEVELS)
        task = program.training_triplet(kind, level, rng)
        if solving:
            worked = not (kind == "abduction" or level >= 2) or rng.random() >= self.bare_answer_rate
            return program.solver_prompt(kind, task), program.solve_completion(kind, task, worked)
        if kind == "induction":
            shown = program.training_triplet("deduction", rng.choice(program.LEVELS), rng)
            task = program.make_triplet(shown.program, [int(i) for i in task.inputs], program.message_of(shown.program))
            return program.proposer_prompt(kind, [shown]), program.proposal_completion(kind, task)
        references = [program.training_triplet(rng.choice(KINDS[:2]), rng.choice(program.LEVELS), rng)
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
