"""Format help: formats the recipes' own parsers accept, constrained decoding and its log-probs, the no-valid-output
warning, and the config checks (fast; the smollm2 loop tests are in test_real_lm_loop.py and
test_real_lm_warmup_loop.py)."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from coevolve.config import ConfigError
from coevolve.formats import FormatWatch, load_worked_examples
from coevolve.recipes import FORMATS
from coevolve.rollout.base import SamplingParams
from coevolve.rollout.constrained import RegexConstraint
from coevolve.rollout.hf import HFRolloutEngine, encode_prompt
from coevolve.sft import warmup_pairs

# the generators coevolve ships
RECIPES_SHIPPED = ("r_zero", "prism", "pasodoble", "infuser", "opensir", "dynamic_rl", "spice", "agent0")


@pytest.fixture(scope="module")
def examples():
    return load_worked_examples(12, seed=3)


def test_rendered_examples_match_regex_and_parse_as_valid(examples):
    """Each chat format's worked example matches its regex and reads back through the format's own parser."""
    from coevolve.rollout import Completion

    for e in examples:
        texts = {name: fmt.render(e) for name, fmt in FORMATS.items()}
        texts["dynamic_rl"] = texts["dynamic_rl"].split("Solution:")[0] + "Solution:"  # generation stops there
        for name, text in texts.items():
            assert re.fullmatch(FORMATS[name].regex, text), (name, text)
        question = " ".join(e.question.split())
        read = {name: FORMATS[name].parse(Completion("", [], [], text, finish_reason="stop"), "chat",
                                          document=e.solution, rules="paper") for name, text in texts.items()}
        for name in ("r_zero", "pasodoble", "infuser", "spice", "agent0"):
            assert (read[name].question, read[name].answer) == (question, e.answer), name
        assert read["opensir"].valid and read["opensir"].concepts
        assert read["dynamic_rl"].question == question and read["dynamic_rl"].valid


def test_every_generator_declares_its_worlds_and_the_arith_one_reads_the_writer_format():
    """Every registered generator recipe (the built-ins and any other, e.g. the guide's saved in coevolve/recipes/)
    has an arith format on the writer prompt; one without a chat format refuses a chat task before a model loads."""
    from coevolve.config import ConfigError
    from coevolve.recipes import RECIPES, resolve
    from coevolve.recipes.generator import GeneratorRecipe
    from coevolve.tasks import arith

    generators = {name: cls for name, cls in RECIPES.items() if issubclass(cls, GeneratorRecipe)}
    assert set(generators) >= set(RECIPES_SHIPPED)
    for name, cls in generators.items():
        assert "arith" in cls.formats and set(cls.formats) <= {"chat", "arith"}, name
        if "chat" not in cls.formats:
            with pytest.raises(ConfigError):
                resolve(name, sets=["task=math"])
        fmt = cls.formats["arith"]
        inputs = {"document": "a=3,b=7"} if fmt.grounded else {"opensir": {"reference": "1+2"},
                                                                "spice": {"document": "a=3,b=7"}}.get(name, {})
        assert fmt.prompt("compact", **inputs).endswith("W:\n")
        assert fmt.grounded == (name in ("infuser", "pasodoble")) or name not in RECIPES_SHIPPED, name
        assert "a=3,b=7" in fmt.prompt("compact", **inputs) or not fmt.grounded
    assert arith.question_prompt("compact") == RECIPES["r_zero"].formats["arith"].prompt("compact")


def test_warmup_pairs_use_each_recipes_prompt(examples):
    for recipe in FORMATS:
        pairs = warmup_pairs(recipe, examples[:3])
        assert len(pairs) == 3 and all(target == FORMATS[recipe].render(e) for (_, target), e in zip(pairs, examples))
    passage_prompt, _ = warmup_pairs("pasodoble", examples[:1])[0]
    assert examples[0].solution in passage_prompt  # the document is the worked solution


def test_format_watch_warns_once_after_k_empty_steps(caplog):
    watch = FormatWatch("infuser", after=2, description=FORMATS["infuser"].description)
    with caplog.at_level(logging.WARNING, logger="coevolve.format_help"):
        assert [watch.observe(s, v, 8) for s, v in [(1, 0), (2, 1), (3, 0), (4, 0), (5, 0), (6, 0)]] == \
            [False, False, False, True, False, False]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert '"question_text"' in message and "params.format_examples" in message and "coevolve sft infuser" in message


def test_constrained_sampling_matches_regex_and_records_masked_logprobs(random_policy):
    regex = r"[1-9][0-9]?\+[1-9][0-9]?"
    engine = HFRolloutEngine(random_policy.model, random_policy.tokenizer, batch_size=8,
                             eos_token_ids=[random_policy.tokenizer.eos_token_id])
    params = SamplingParams(temperature=1.0, max_new_tokens=12, regex=regex)
    out = engine.generate(["W:"] * 6, params, seed=0)
    assert all(re.fullmatch(regex, c.text) for c in out)
    assert all(c.finish_reason == "eos" for c in out)
    # Recompute: log q = log_softmax of the masked logits, which is above the unconstrained log-prob wherever
    # the mask removed mass; the engine must have recorded log q.
    for c in out:
        ids = torch.tensor([encode_prompt(random_policy.tokenizer, "W:") + c.token_ids])
        with torch.no_grad():
            logits = random_policy.model(ids).logits[0, -len(c.token_ids) - 1:-1].float()
        constraint = RegexConstraint(random_policy.tokenizer, logits.shape[-1], regex,
                                     [random_policy.tokenizer.eos_token_id], 1)
        masked = []
        for t, token in enumerate(c.token_ids):
            masked.append(constraint.mask(logits[t:t + 1], [0], [True])[0].log_softmax(-1)[token])
            constraint.accept([token], [0], [True])
        plain = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs), torch.stack(masked), atol=1e-5)
        assert (torch.tensor(c.logprobs) >= plain - 1e-6).all() and (torch.tensor(c.logprobs) > plain + 1e-3).any()


def test_format_constraint_turns_on_tis_and_help_is_refused_on_arith():
    from coevolve.recipes import RECIPES, resolve
    from coevolve.roles import tis_cap

    cfg, params, cls = resolve("r_zero", sets=["task=math", "model=smollm2-135m", "params.format_constraint=true"])
    assert tis_cap(cfg, bf16_sampler=False, constrained=cls.constrains_rollouts(params)) == 2.0
    cfg, params, cls = resolve("r_zero", preset="paper")
    assert tis_cap(cfg, bf16_sampler=False, constrained=cls.constrains_rollouts(params)) is None
    assert params.format_examples == 0 and not params.format_constraint
    with pytest.raises(ConfigError, match="format help is for chat tasks"):
        resolve("r_zero", preset="small", sets=["params.format_examples=2"])
    for name in ("r_zero", "prism", "pasodoble", "infuser", "opensir", "dynamic_rl"):
        for preset in RECIPES[name].presets:
            _, params, _ = resolve(name, preset=preset)
            assert not (params.format_examples or params.format_constraint or params.generator_init), (name, preset)


def test_format_watch_on_arith_names_the_writer_format(caplog):
    watch = FormatWatch("r_zero", after=1, description=None)
    with caplog.at_level(logging.WARNING, logger="coevolve.format_help"):
        assert watch.observe(1, 0, 4)
    assert "Q:<expression>" in caplog.records[0].getMessage()


def test_a_run_whose_generator_writes_nothing_valid_warns_once(random_model_dir, tmp_path, caplog):
    from coevolve.loop import run
    from coevolve.recipes import resolve

    cfg, params, cls = resolve("dynamic_rl", sets=[f"model={random_model_dir}", "task=arith", "steps=3",
                                                   "eval_sets=[]", "params.n=4", "params.m=2",
                                                   "params.format_warn_after=2"])
    with caplog.at_level(logging.WARNING, logger="coevolve.format_help"):
        run(cls(cfg, params), cfg, tmp_path / "run", progress=False)
    warnings = [r.getMessage() for r in caplog.records if "no valid output" in r.getMessage()]
    assert len(warnings) == 1 and "2 consecutive steps" in warnings[0]


def test_sft_command_rejects_bad_input_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from coevolve.cli import app

    for args, message in [(["sft", "grpo"], "recipe 'grpo' has no generator output format"),
                          (["sft", "r_zero", "--set", "stepz=3"], "unknown config key 'stepz'"),
                          (["sft", "r_zero", "--set", "lr=-1"], "config key 'lr'")]:
        result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
