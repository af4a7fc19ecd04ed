"""Small helpers the test files share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from coevolve.recipes import resolve
from coevolve.recipes.base import Recipe
from coevolve.rl.trainer import TrainSample


def records(out: Any) -> list[dict[str, Any]]:
    """A recipe step's sample rows (``StepOutput.samples``) as the JSON records the run store writes."""
    return [row.as_record() for row in out.samples]


def make_recipe(name: str, model_dir: Any, *sets: str, preset: str | None = None) -> Recipe:
    """Recipe ``name`` on ``model_dir`` without evaluation sets: its defaults (or ``preset``) under ``sets``."""
    config, params, cls = resolve(name, preset=preset, sets=[f"model={model_dir}", "eval_sets=[]", *sets])
    return cls(config, params)


def read_generations(recipe: Any, parse: Callable[..., Any]) -> None:
    """Give a generator recipe's format the stand-in reader ``parse(output, style, **inputs)`` (the random models of
    the tests write no parsable question)."""
    recipe.generator_format = replace(recipe.generator_format, parse=parse)


def random_samples(prompts: Sequence[list[int]], lengths: Sequence[int], *, tokens: tuple[int, int] = (5, 40),
                   seed: int = 0, rollout_logprob: float | None = None,
                   advantages: Sequence[float] = (1.0,)) -> list[TrainSample]:
    """Update samples with random completions of ``lengths`` tokens (ids in ``tokens``), the k-th for prompt
    ``prompts[k % len(prompts)]`` (so samples share prompts when there are fewer prompts than lengths), with
    advantage ``advantages[k % len(advantages)]``; rollout log-probs all ``rollout_logprob`` (none when None)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(lengths):
        completion = torch.randint(*tokens, (n,), generator=gen).tolist()
        logprobs = [] if rollout_logprob is None else [rollout_logprob] * n
        out.append(TrainSample(list(prompts[k % len(prompts)]), completion, logprobs, advantages[k % len(advantages)]))
    return out


def scripted_gpt2(tokenizer, text_at: dict[int, str], width: int = 160):
    """A GPT-2 whose greedy token after absolute position p is ``text_at[p]`` (EOS where unset): every weight zero
    but one-hot position embeddings and an untied head that maps each position to its character."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), n_positions=width, n_embd=width, n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.transformer.ln_f, model.transformer.h[0].ln_1, model.transformer.h[0].ln_2):
            norm.weight.fill_(1.0)
        model.transformer.wpe.weight.copy_(torch.eye(width))
        for p in range(width):
            ch = text_at.get(p)
            model.lm_head.weight[tokenizer.eos_token_id if ch is None else tokenizer.convert_tokens_to_ids(ch), p] = 10
    return model


class CallThenAnswer:
    """A stand-in engine for arithmetic episodes: turn 1 prints the question's expression in a python call, turn 2
    answers with the number the observation holds."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling, seed):
        from coevolve.rollout import Completion
        from coevolve.rollout.hf import encode_prompt

        out = []
        for prompt in prompts:
            question, _, episode = prompt.partition("=?\n")
            text = (f"```python\nprint({question.removeprefix('Q:')})\n```\n```output" if not episode
                    else f"A:{episode.split('```output')[1].split()[0]}")
            reason = "stop" if text.endswith("```output") else "eos"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Completion(prompt, encode_prompt(self.tokenizer, prompt), ids, text, [-1.0] * len(ids),
                                  reason))
        return out

    def pop_metrics(self):
        return {}
