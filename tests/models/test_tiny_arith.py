"""The tiny-arith model: tokenizer, deterministic pretraining, cached build, emitted formats."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coevolve.models.tiny_arith import TinyArithBuild, build_tokenizer, ensure_tiny_arith, pretrain
from coevolve.rollout.base import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import arith


def _format_texts() -> list[str]:
    rng = random.Random(0)
    texts = []
    for level in arith.LEVELS:
        for grounded in (False, True):
            p = arith.generate_problem(level, rng, grounded)
            texts += [arith.solver_prompt(p.question, p.doc) + arith.solve_completion(p),
                      arith.question_prompt(examples=[p.question], doc=p.doc) + arith.question_completion(p)]
    return texts


def test_tokenizer_round_trips_every_format_character(tmp_path):
    tokenizer = build_tokenizer()
    texts = _format_texts() + ["0123456789+-*()=?;:,\n" + "".join(map(chr, range(ord("a"), ord("z") + 1)))]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and len(ids) == len(text) + 1
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert [reloaded(t)["input_ids"] for t in texts] == [tokenizer(t)["input_ids"] for t in texts]
    assert (reloaded.eos_token_id, reloaded.pad_token_id, reloaded.bos_token_id) == (
        tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id)


def test_pretraining_is_deterministic():
    build = TinyArithBuild(hidden=32, layers=1, heads=2, intermediate=64, steps=6, batch=8, warmup=2)
    model_a, _, losses_a = pretrain(build)
    model_b, _, losses_b = pretrain(build)
    assert losses_a == losses_b
    for (name, a), (_, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
        assert torch.equal(a, b), name
    _, _, losses_c = pretrain(dataclasses.replace(build, seed=1))
    assert losses_c != losses_a


def test_fingerprint_depends_on_settings():
    build = TinyArithBuild.default()
    assert build.fingerprint() == TinyArithBuild.default().fingerprint()
    assert build.fingerprint() != dataclasses.replace(build, steps=build.steps + 1).fingerprint()


@pytest.fixture(scope="module")
def built(small_tiny_arith):
    return small_tiny_arith


def test_build_folder_and_cache_hit(built):
    cache, folder = built
    assert folder.parent == cache and folder.name == f"tiny-arith-{TinyArithBuild.for_tests().fingerprint()}"
    assert {"model.safetensors", "config.json", "tokenizer.json", "build_info.json"} <= {
        p.name for p in folder.iterdir()}
    assert not list(cache.glob(f"{folder.name}.tmp-*"))  # other builds may be in flight beside it (xdist)
    info = json.loads((folder / "build_info.json").read_text())
    assert set(info["accuracy"]) == {str(lv) for lv in arith.LEVELS}
    assert info["build"] == dataclasses.asdict(TinyArithBuild.for_tests())
    stamp = (folder / "build_info.json").stat().st_mtime_ns
    assert ensure_tiny_arith(cache, TinyArithBuild.for_tests(), progress=False) == folder
    assert (folder / "build_info.json").stat().st_mtime_ns == stamp


def test_built_model_emits_parseable_formats(built):
    _, folder = built
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = HFRolloutEngine(model, tokenizer)
    problems = arith.held_out(1, 16) + arith.held_out(2, 8, grounded=True)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=96)
    outputs = engine.generate([arith.solver_prompt(p.question, p.doc) for p in problems], greedy, seed=0)
    answers = [arith.parse_answer(o.text) for o in outputs]
    assert sum(a is not None and a.lstrip("-").isdigit() for a in answers) >= 0.75 * len(problems)
    assert all(o.finish_reason == "eos" for o in outputs[:16])
    written = engine.generate([arith.question_prompt()] * 16, SamplingParams(temperature=1.0, max_new_tokens=48),
                              seed=0)
    assert sum(o.text.startswith("Q:") for o in written) >= 12


def test_bare_answers_only_for_multi_step_problems():
    from coevolve.models.tiny_arith import _sample

    rng = random.Random(0)
    pairs = [_sample(rng, 3, 0.6) for _ in range(3000)]
    solves = [(arith.level_of(p.split("Q:")[1].split("=?")[0], _doc(p)), c) for p, c in pairs if "=?" in p]
    bare = [level for level, c in solves if not c.startswith("S:")]
    assert bare and min(bare) == 2 and all(c.startswith("A:") for _, c in solves if not c.startswith("S:"))
    multi = [c for level, c in solves if level >= 2]
    assert abs(sum(not c.startswith("S:") for c in multi) / len(multi) - 0.6) < 0.05
    assert all(c.startswith("S:") for level, c in solves if level == 1)


def _doc(prompt: str) -> str | None:
    return prompt.split("\n")[0][2:] if prompt.startswith("D:") else None
