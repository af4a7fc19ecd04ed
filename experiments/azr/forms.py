"""Greedy held-out accuracy of a tiny-program build when it is made to answer in the worked form (the prompt ends in
``S:``) and when it is made to answer bare (``O:`` / ``I:``), per task type and program level: whether the worked form
is the better behaviour a reward for correct answers can select.

    python -m experiments.azr.forms [MODEL_FOLDER]     # default: the tiny-program build (built on first use)
"""

import sys
from collections import Counter
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from coevolve.models.tiny_program import ensure_tiny_program
from coevolve.rollout.base import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import program
from coevolve.tasks.triplets import Kind

FORMS: dict[Kind, tuple[str, str]] = {"deduction": ("S:", "O:"), "abduction": ("S:", "I:")}


def forced_form_accuracy(folder: Path) -> dict[str, dict[int, float]]:
    """``{"<kind> <prefix>": {level: accuracy}}`` over the 200 held-out tasks of deduction and abduction."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    out = {}
    for kind, prefixes in FORMS.items():
        tasks = program.held_out_tasks(kind)
        for prefix in prefixes:
            outputs = engine.generate([program.solver_prompt(kind, t.triplet) + prefix for t in tasks],
                                      SamplingParams(temperature=0.0, max_new_tokens=128), seed=0)
            right, total = Counter[int](), Counter[int]()
            for output, task in zip(outputs, tasks):
                total[task.level] += 1
                right[task.level] += program.check(kind, task.triplet, program.read_answer(kind, prefix + output.text))
            out[f"{kind} {prefix}"] = {level: right[level] / total[level] for level in sorted(total)}
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ensure_tiny_program()
    for form, by_level in forced_form_accuracy(folder).items():
        print(f"{form:14s}", "  ".join(f"L{level} {acc:.3f}" for level, acc in by_level.items()))
