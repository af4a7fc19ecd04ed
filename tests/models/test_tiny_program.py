"""The tiny-program model (AZR's program world): its corpus, its cached build, the formats it writes; and the
tiny-arith builds it shares machinery with, unchanged."""

from __future__ import annotations

import json
import random

from transformers import AutoModelForCausalLM, AutoTokenizer

from coevolve.models.tiny_arith import TinyArithBuild
from coevolve.models.tiny_program import TinyProgramBuild
from coevolve.rollout.base import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import program
from coevolve.tasks.triplets import KINDS


def test_tiny_arith_builds_keep_their_cache_folders():
    # generalising the build machinery for tiny-program must not change what a tiny-arith build is: these names
    # (hashes of the settings and versions) are the cache folders every tiny-arith experiment ran on
    assert TinyArithBuild.default().fingerprint() == "9e7ee49240d8"
    assert TinyArithBuild.for_tests().fingerprint() == "16c501303226"
    assert TinyProgramBuild.default().fingerprint() != TinyArithBuild.default().fingerprint()


def test_the_corpus_writes_every_format_and_no_held_out_program():
    build, rng, held = TinyProgramBuild.default(), random.Random(0), program.held_out_programs()
    pairs = [build.sample(rng) for _ in range(3000)]
    queries = {prompt.splitlines()[-1] for prompt, _ in pairs}
    assert queries == {"O?", "I?", "P?", "W:D", "W:A", "W:I"}
    solving = sum(prompt.endswith("?\n") for prompt, _ in pairs) / len(pairs)
    assert abs(solving - build.solve_share) < 0.03
    deduction = [(p, c) for p, c in pairs if p.endswith("O?\n")]
    bare = [p for p, c in deduction if not c.startswith("S:")]
    assert all(program.level_of_program(p.splitlines()[0][2:]) >= 2 for p in bare)  # one step: always worked
    assert 0.3 < len(bare) / len(deduction) < 0.6
    programs = {line[2:] for p, c in pairs for line in (p + "\n" + c).splitlines() if line.startswith("P:")}
    assert programs and not programs & held
    solved = [program.make_triplet(p.splitlines()[0][2:], [int(c.splitlines()[-1][2:])]) for p, c in pairs
              if p.endswith("I?\n")]  # abduction: the answer is the input
    assert solved and not any(program.is_held_out("abduction", t) for t in solved if t is not None)


def test_build_writes_its_report_and_the_model_proposes_valid_tasks(small_tiny_program):
    cache, folder = small_tiny_program
    assert folder.name == f"tiny-program-{TinyProgramBuild.for_tests().fingerprint()}"
    info = json.loads((folder / "build_info.json").read_text())
    assert set(info["accuracy"]) == set(KINDS) == set(info["valid_proposal_rate"])
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    engine, world = HFRolloutEngine(model, tokenizer), program.TinyProgramWorld()
    seed = world.seed_triplet()
    for kind in KINDS:
        outputs = engine.generate([program.proposer_prompt(kind, [seed])] * 16,
                                  SamplingParams(temperature=1.0, max_new_tokens=48), seed=0)
        read = [world.read_proposal(kind, o.text, seed.program) for o in outputs]
        valid = [v for v in world.validate([r for r in read if not isinstance(r, str)]) if v.triplet]
        assert len(valid) >= 8, (kind, [o.text for o in outputs])
