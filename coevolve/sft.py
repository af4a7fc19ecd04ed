"""Format warm-up: a short supervised fine-tune of a generator on correctly formatted outputs (``coevolve sft``).

The data are real problems (GSM8K train) with their answers rendered in the recipe's exact output format, each after
the recipe's own generator prompt (:func:`warmup_pairs`); the loss is the mean cross-entropy
of the target tokens (and the end-of-turn token), the prompt masked out. PasoDoble's paper calls this its cold start.
The output folder holds ``sft.yaml`` (the resolved config), ``metrics.jsonl`` (loss per step), ``summary.json`` and
``model/`` (weights and tokenizer), which a run uses with ``--set params.generator_init=DIR``.

``warmup: tools`` teaches a solver the tool-using episodes of ``docs/tools.md`` instead (:func:`tool_warmup_pairs`):
arithmetic problems asked in the recipe's chat solver prompt with tools, each answered by one python call, its real
output and the boxed answer. The observation's tokens are context but not targets, exactly as the RL trainer masks
them (:func:`episode_target`); a run starts both roles from it with ``--set model=DIR/model``.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import Field, ValidationError

from coevolve.config import ConfigError, Strict, _first_error
from coevolve.formats import GeneratorFormat, WorkedExample, load_worked_examples
from coevolve.jsonio import atomic_write_text, dumps
from coevolve.recipes import FORMATS, RECIPES
from coevolve.rollout.episodes import CODE_CLOSE, CODE_OPEN, TOOL_CALL_STOP, ToolResult, observation, observation_spans
from coevolve.tasks import arith
from coevolve.tasks import math as math_task

TOOL_LEVELS = (2, 3, 4, 5, 6)  # arithmetic levels of the tool warm-up's problems (values into the millions)


class SFTConfig(Strict):
    """The warm-up of one recipe's generator (format) or solver (tools)."""

    recipe: str
    model: str = "smollm2-135m"
    warmup: Literal["format", "tools"] = Field(
        "format", description="format: the recipe's generator output format on GSM8K-train problems; tools: its solver "
        "answering arithmetic problems with one python call (docs/tools.md), observations masked out of the loss")
    examples: int = Field(256, gt=0, description="problems rendered in the warm-up's format")
    steps: int = Field(40, gt=0, description="AdamW steps")
    batch_size: int = Field(8, gt=0, description="sequences per step")
    lr: float = Field(5e-5, gt=0)
    max_tokens: int = Field(512, gt=0, description="prompt + target tokens kept per sequence")
    seed: int = 0
    data_dir: str | None = None
    threads: int | None = Field(None, gt=0, description="torch CPU threads (default: torch's)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available")


def resolve_sft(recipe: str, sets: dict[str, Any]) -> SFTConfig:
    """The validated warm-up config for ``recipe`` with ``--set`` overrides (ConfigError names a bad key)."""
    try:
        config = SFTConfig.model_validate({"recipe": recipe, **sets})
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from None
    if config.warmup == "format":
        output_format(recipe)  # a recipe without a generator format is a one-line error
    elif recipe not in RECIPES:
        raise KeyError(f"unknown recipe {recipe!r} (known: {', '.join(sorted(RECIPES))})")
    return config


def output_format(recipe: str) -> GeneratorFormat:
    """The chat output format of ``recipe``'s generator (one-line KeyError for a recipe without a generator)."""
    try:
        return FORMATS[recipe]
    except KeyError:
        raise KeyError(f"recipe {recipe!r} has no generator output format (known: {', '.join(FORMATS)})") from None


def warmup_pairs(recipe: str, examples: list[WorkedExample], seed: int = 0) -> list[tuple[str, str]]:
    """(generator user message, target output) pairs for the format warm-up of ``recipe``: the recipe's own
    generator prompt for each example (its ``warmup_prompt``), then the example in the recipe's format."""
    fmt, rng = output_format(recipe), random.Random(seed)
    return [(fmt.warmup_prompt(e, examples, rng), fmt.render(e)) for e in examples]


def tool_warmup_pairs(recipe: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(solver user message, episode) pairs for the tool warm-up of ``recipe``'s solver: ``n`` arithmetic problems of
    levels 2-6 asked as math questions after the recipe's ``tool_instruction``, each answered in the syntax of
    ``docs/tools.md``: a python call that prints the expression, its observation (what Python prints for it: the
    exact integer, computed by :func:`coevolve.tasks.arith.evaluate`) and the answer in a box."""
    instruction = RECIPES[recipe].tool_instruction
    pairs = []
    for problem in arith.sample_problems(n, random.Random(seed), levels=TOOL_LEVELS):
        message = math_task.solver_prompt(f"What is {problem.question}?")
        call = f"Let me compute it.\n{CODE_OPEN}\nprint({problem.question})\n{CODE_CLOSE}\n{TOOL_CALL_STOP}"
        shown = observation(ToolResult(str(problem.answer), "ok"))
        pairs.append((f"{instruction}\n\n{message}" if instruction else message,
                      f"{call}{shown}The answer is \\boxed{{{problem.answer}}}."))
    return pairs


def episode_target(tokenizer, target: str, observations: bool) -> tuple[list[int], list[bool]]:
    """The token ids of ``target`` and which of them are trained: with ``observations``, each observation of
    ``target`` (:func:`coevolve.rollout.episodes.observation_spans`) is encoded on its own, as the episode loop
    encodes an observation, and is context but no target (the RL trainer's ``tool_mask``); the model's text between
    them is encoded piece by piece, as its turns are sampled."""
    spans = observation_spans(target) if observations else []
    ids: list[int] = []
    trained: list[bool] = []
    at = 0
    for start, end in [*spans, (len(target), len(target))]:
        for piece, learn in ((target[at:start], True), (target[start:end], False)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                trained += [learn] * len(piece_ids)
        at = end
    return ids, trained


def _batch(rows: list[tuple[list[int], list[int], list[bool]]], pad_id: int,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 on prompt, untrained target tokens and padding)."""
    width = max(len(p) + len(t) for p, t, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (prompt, target, trained) in enumerate(rows):
        seq = prompt + target
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
        labels[row, len(prompt):len(seq)] = torch.tensor([t if learn else -100 for t, learn in zip(target, trained)])
    return ids, mask, labels


def warmup_data(config: SFTConfig, policy) -> list[tuple[list[int], list[int], list[bool]]]:
    """(prompt ids, target ids, trained flags) of every warm-up example, cut to ``max_tokens`` (the start of the
    prompt is cut first)."""
    from coevolve.rollout.hf import encode_prompt

    tokenizer, eos = policy.tokenizer, policy.eos_token_ids[:1]
    if config.warmup == "tools":
        pairs = tool_warmup_pairs(config.recipe, config.examples, config.seed)
    else:
        pairs = warmup_pairs(config.recipe, load_worked_examples(config.examples, config.seed, config.data_dir),
                             config.seed)
    data = []
    for message, target in pairs:
        prompt = encode_prompt(tokenizer, policy.format_prompt(message))
        target_ids, trained = episode_target(tokenizer, target, observations=config.warmup == "tools")
        target_ids, trained = target_ids + eos, trained + [True] * len(eos)
        keep = max(0, config.max_tokens - len(target_ids))
        data.append((prompt[-keep:] if keep else [], target_ids[:config.max_tokens], trained[:config.max_tokens]))
    return data


def run_sft(config: SFTConfig, out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Fine-tune ``config.model`` on the recipe's formatted outputs; write the folder described above."""
    from coevolve.models import hf_model_source, load_policy

    out = Path(out_dir)
    if (out / "model").exists():
        raise ConfigError(f"{out} already holds a warm-up model; choose another --out")
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    device = "cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu"
    policy = load_policy(hf_model_source(config.model), device=device)  # a plain HF folder: save_pretrained works
    tokenizer, model = policy.tokenizer, policy.model
    data = warmup_data(config, policy)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sft.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    order, rng, cursor = list(range(len(data))), random.Random(config.seed), len(data)
    model.train()
    started, rows = time.perf_counter(), []
    with open(out / "metrics.jsonl", "w") as metrics:
        for step in range(1, config.steps + 1):
            picked = []
            while len(picked) < config.batch_size:
                if cursor == len(order):
                    rng.shuffle(order)
                    cursor = 0
                picked.append(data[order[cursor]])
                cursor += 1
            ids, mask, labels = _batch(picked, tokenizer.pad_token_id)
            loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            row = {"step": step, "loss": round(loss.item(), 5), "time_s": round(time.perf_counter() - started, 2)}
            rows.append(row)
            metrics.write(dumps(row) + "\n")
            metrics.flush()
            if progress:
                print(f"sft step {step}/{config.steps}: loss {row['loss']:.4f}", flush=True)
    model.eval()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    summary = {"recipe": config.recipe, "model": config.model, "warmup": config.warmup, "steps": config.steps,
               "examples": len(data), "first_loss": rows[0]["loss"], "final_loss": rows[-1]["loss"],
               "wall_s": rows[-1]["time_s"], "model_dir": str(out / "model")}
    atomic_write_text(out / "summary.json", dumps(summary) + "\n")
    return summary
