"""The evaluation harness: exact accuracy arithmetic with a scripted engine, files, presets, a tiny real model."""

import json
import string
from collections import defaultdict
from collections.abc import Sequence

import pytest
import torch

from coevolve.evaluation import EVAL_PRESETS, EvalItem, evaluate
from coevolve.models import Policy
from coevolve.rollout.base import Completion, SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import math as math_task


class ScriptedEngine:
    """Answers each prompt with the next completion scripted for the question it contains."""

    def __init__(self, script: dict[str, list[str]]):
        self.script = script
        self.served: dict[str, int] = defaultdict(int)
        self.calls: list[tuple[int, SamplingParams, int]] = []
        self.prompts: list[str] = []

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        self.calls.append((len(prompts), params, seed))
        self.prompts += prompts
        out = []
        for prompt in prompts:
            key = next(k for k in self.script if k in prompt)
            text = self.script[key][self.served[key] % len(self.script[key])]
            self.served[key] += 1
            out.append(Completion(prompt=prompt, prompt_ids=[], token_ids=[0] * len(text), text=text,
                                  finish_reason="eos"))
        return out


class ChatPolicy:
    """The part of a Policy the harness uses: a prompt style and a chat wrapper."""

    prompt_style = "chat"

    def format_prompt(self, user_message: str) -> str:
        return f"<user>{user_message}</user><assistant>"


MATH = [EvalItem("m/0", "toy_math", "math", "What is 2+2?", "4"),
        EvalItem("m/1", "toy_math", "math", "What is 7*6?", "42", meta={"level": 2})]
MCQ = [EvalItem("c/0", "toy_mcq", "mcq", "Which is green?", "B", ("grass is red", "grass is green", "blue"))]
ARITH = [EvalItem("a/0", "toy_arith", "arith", "3+4*5", "23", meta={"level": 2})]
SCRIPT = {
    "2+2": ["so \\boxed{4}", "\\boxed{4}", "\\boxed{5}", "I do not know"],
    "7*6": ["\\boxed{42}", "\\boxed{42.0}", "\\boxed{13}", "\\boxed{24}"],
    "Which is green": ["\\boxed{B}", "\\boxed{A}", "\\boxed{B}", "\\boxed{B}"],
    "3+4*5": ["\\boxed{23}"],
}


def test_scripted_accuracy_pass_at_k_and_files(tmp_path) -> None:
    engine = ScriptedEngine(SCRIPT)
    sets = {"toy_math": MATH, "toy_mcq": MCQ, "toy_arith": ARITH}
    out = evaluate(ChatPolicy(), engine, sets, preset="opensir", n_samples=4, batch_size=3, seed=10,
                   max_new_tokens=32, out_dir=tmp_path, progress=False)

    math_summary = out["toy_math"]
    # each question: 2 of 4 correct; pass@2 = 1 - C(2,2)/C(4,2) = 5/6
    assert math_summary["accuracy"] == math_summary["avg@4"] == math_summary["pass@1"] == pytest.approx(0.5)
    assert math_summary["pass@2"] == pytest.approx(5 / 6) and math_summary["pass@4"] == 1.0
    assert math_summary["answered"] == pytest.approx(7 / 8) and math_summary["tokens"] == sum(
        len(t) for k in ("2+2", "7*6") for t in SCRIPT[k])
    assert math_summary["n_questions"] == 2 and math_summary["by_level"] == {"2": 0.5}
    assert out["toy_mcq"]["accuracy"] == pytest.approx(0.75) and out["toy_mcq"]["pass@2"] == 1.0
    assert out["toy_arith"]["accuracy"] == 1.0 and out["toy_arith"]["by_level"] == {"2": 1.0}

    # 8 math samples in batches of 3: seeds restart per set; the preset's settings, overridden where given
    assert [(size, seed) for size, _, seed in engine.calls[:3]] == [(3, 10), (3, 11), (2, 12)]
    assert engine.calls[0][1] == SamplingParams(temperature=0.6, top_p=0.95, top_k=0, max_new_tokens=32)
    assert engine.prompts[0] == f"<user>What is 2+2?\n{math_task.INSTRUCTION}</user><assistant>"
    assert "B) grass is green" in engine.prompts[8] and "\\boxed{" in engine.prompts[-1]

    records = [json.loads(line) for line in (tmp_path / "toy_math" / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["m/0", "m/1"]
    assert records[0]["extracted"] == ["4", "4", "5", None] and records[0]["correct"] == [True, True, False, False]
    assert records[0]["completions"] == SCRIPT["2+2"] and records[0]["prompt"] == engine.prompts[0]
    assert json.loads((tmp_path / "toy_mcq" / "summary.json").read_text()) == out["toy_mcq"]
    assert json.loads((tmp_path / "summary.json").read_text()) == out
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_greedy_default_and_argument_checks() -> None:
    engine = ScriptedEngine(SCRIPT)
    out = evaluate(ChatPolicy(), engine, {"toy_math": MATH}, progress=False)["toy_math"]
    assert out["accuracy"] == out["avg@1"] == out["pass@1"] == 1.0 and out["n_samples"] == 1
    assert engine.calls[0][1] == SamplingParams(temperature=0.0, top_p=1.0, top_k=0,
                                                max_new_tokens=EVAL_PRESETS["greedy"].max_new_tokens)
    with pytest.raises(ValueError, match="identical"):
        evaluate(ChatPolicy(), engine, {"toy_math": MATH}, n_samples=2, progress=False)
    with pytest.raises(ValueError, match="pass@k"):
        evaluate(ChatPolicy(), engine, {"toy_math": MATH}, preset="pasodoble", k=[1, 8], progress=False)
    with pytest.raises(KeyError, match="presets|preset"):
        evaluate(ChatPolicy(), engine, {"toy_math": MATH}, preset="nope", progress=False)


def test_ttrl_and_r_zero_protocols() -> None:
    """TTRL's scripts validate avg@16 at temperature 0.6, top-p 0.95 within 3 x 1024 tokens; R-Zero's evaluate
    greedily within 4096 tokens, one sample."""
    ttrl, r_zero = EVAL_PRESETS["ttrl"], EVAL_PRESETS["r_zero"]
    assert (ttrl.temperature, ttrl.top_p, ttrl.top_k, ttrl.max_new_tokens, ttrl.n_samples) == (0.6, 0.95, 0, 3072, 16)
    assert (r_zero.temperature, r_zero.top_p, r_zero.top_k, r_zero.max_new_tokens, r_zero.n_samples) == (
        0.0, 1.0, 0, 4096, 1)
    engine = ScriptedEngine(SCRIPT)
    out = evaluate(ChatPolicy(), engine, {"toy_math": MATH}, preset="ttrl", progress=False)["toy_math"]
    # 16 samples per question cycle each script: 2+2 right 8 of 16, 7*6 right 8 of 16 (42 and 42.0)
    assert out["n_samples"] == 16 and out["avg@16"] == out["accuracy"] == 0.5 and out["pass@16"] == 1.0
    assert engine.calls[0][1] == SamplingParams(temperature=0.6, top_p=0.95, top_k=0, max_new_tokens=3072)


def _char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(string.printable))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tokenizer.padding_side = "left"
    return tokenizer


def test_end_to_end_on_a_tiny_random_model(tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = _char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    engine = HFRolloutEngine(model, tokenizer)
    chat = Policy(name="tiny-random", model=model, tokenizer=tokenizer, prompt_style="chat")
    compact = Policy(name="tiny-random", model=model, tokenizer=tokenizer, prompt_style="compact")

    out = evaluate(chat, engine, ["math500", "supergpqa"], limit=2, max_new_tokens=5, out_dir=tmp_path,
                   progress=False)
    for name in ("math500", "supergpqa"):
        assert out[name]["n_questions"] == 2 and out[name]["tokens"] <= 10 and out[name]["accuracy"] == 0.0
    record = json.loads((tmp_path / "math500" / "results.jsonl").read_text().splitlines()[0])
    assert record["prompt"].startswith("<|user|>") and record["prompt"].endswith("<|assistant|>")
    assert len(record["completions"]) == 1

    kwargs = dict(preset="dynamic_rl", n_samples=3, max_new_tokens=4, limit=2, seed=5, progress=False)
    first = evaluate(compact, engine, ["arith_l1"], out_dir=tmp_path / "a", **kwargs)
    evaluate(compact, engine, ["arith_l1"], out_dir=tmp_path / "b", **kwargs)
    assert first["arith_l1"]["n_questions"] == 2 and "pass@3" in first["arith_l1"]
    results_a = (tmp_path / "a" / "arith_l1" / "results.jsonl").read_text()
    assert results_a == (tmp_path / "b" / "arith_l1" / "results.jsonl").read_text()  # same seed, same samples
    assert json.loads(results_a.splitlines()[0])["prompt"].startswith("Q:")
