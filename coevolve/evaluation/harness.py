"""Evaluate a policy on evaluation sets: prompt, sample in batches, grade, score, write results.

The engine may be an episode sampler (``rollout.tools``: :func:`coevolve.roles.evaluation_episodes`): an answer is
then read from the model's own text (``Completion.written_text``), and each set's summary counts the samples that
called a tool (``tool_call_rate``, ``tool_calls_per_sample``; 0 for single turns).

Each completion is graded twice, from the same samples: strictly (the task's answer format, e.g. the last
``\\boxed{}``; this is ``accuracy``, also written as ``accuracy_strict``) and leniently (the last number or
expression in the completion: ``accuracy_lenient``). Each set's summary names both rules (``answer_rules``).

Sampling settings come from a named preset (:data:`EVAL_PRESETS`, collected from the
evaluation sections of the papers; arXiv ids in ``docs/recipes/``); explicit arguments override the preset.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from coevolve.data.benchmarks import EvalItem, load_benchmark
from coevolve.evaluation.metrics import accuracy, avg_at_k, default_ks, mean_pass_at_k
from coevolve.jsonio import atomic_write_text
from coevolve.rollout.base import Completion, RolloutEngine, SamplingParams
from coevolve.tasks.registry import task_for


@dataclass(frozen=True)
class EvalPreset:
    """Sampling settings of one evaluation protocol; ``source`` cites where they come from. ``protocol``: a paper's
    protocol, whose ``max_new_tokens`` a run's ``eval_preset`` brings with it (unless the user sets
    ``eval_max_new_tokens``); the project's own greedy default leaves the run's budget alone."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    n_samples: int
    source: str
    protocol: bool = True


EVAL_PRESETS: dict[str, EvalPreset] = {
    "greedy": EvalPreset(0.0, 1.0, 0, 512, 1,
                         "project default: greedy accuracy (pass@1 as in Prism, arXiv:2603.13309 §5.3); 512 new "
                         "tokens is a CPU budget, not a paper value", protocol=False),
    "prism": EvalPreset(0.0, 1.0, 0, 4096, 1,
                        "Prism (arXiv:2603.13309) §5.3: Pass@1 with greedy decoding; its code: max response "
                        "length 4096"),
    "dynamic_rl": EvalPreset(0.6, 0.95, 20, 3072, 16,
                             "Dynamic RL §3.1: avg@16, temperature 0.6, top-p 0.95, top-k 20; max length "
                             "not stated, 3072 recommended"),
    "opensir": EvalPreset(0.6, 0.95, 0, 4096, 16,
                          "OpenSIR §3.2: avg@16, zero-shot, temperature 0.6, top-p 0.95, at most 4096 tokens"),
    "pasodoble": EvalPreset(0.6, 0.95, 0, 8192, 6,
                            "PasoDoble (arXiv:2511.11881) §4: pass@1 = mean over 6 samples, temperature 0.6, "
                            "top-p 0.95, 8192 context (5 samples on GPQA/SuperGPQA)"),
    "infuser": EvalPreset(0.7, 0.8, 20, 8192, 4,
                          "INFUSER App. F.3: temperature 0.7, top-p 0.8, top-k 20, response 8192; "
                          "avg@4 on MATH500 (1 on most sets, 32 on AIME/HMMT)"),
    "ttrl": EvalPreset(0.6, 0.95, 0, 3072, 16,
                       "TTRL (arXiv:2504.16084) code, every verl/examples/ttrl script: validation sampling "
                       "(val_kwargs) n = 16, temperature 0.6, top-p 0.95, no top-k; response 3 x 1024: avg@16"),
    "r_zero": EvalPreset(0.0, 1.0, 0, 4096, 1,
                         "R-Zero (arXiv:2508.05004) code, evaluation/generate.py: greedy (temperature 0), "
                         "4096 new tokens, one sample per question on its seven math sets (its GPT-4o re-check "
                         "of wrong answers is not reproduced)"),
}


def _arith_style(policy: Any) -> str:
    """The arith prompt style for a policy: raw task format for tiny-arith, plain language otherwise."""
    return "compact" if policy.prompt_style == "compact" else "chat"


def build_prompt(item: EvalItem, policy: Any) -> str:
    """The full prompt for one item: its task's solver message, in the policy's chat template."""
    return policy.format_prompt(task_for(item).item_prompt(item, _arith_style(policy)))


def parse_completion(item: EvalItem, text: str, policy: Any) -> str | None:
    """The answer a completion gives for ``item``, or None."""
    return task_for(item).item_answer(item, text, _arith_style(policy))


def parse_lenient(item: EvalItem, text: str, policy: Any) -> str | None:
    """The answer the lenient rule reads from a completion for ``item``, or None."""
    return task_for(item).item_lenient_answer(item, text, _arith_style(policy))


def answer_rules(item: EvalItem, policy: Any) -> dict[str, str]:
    """The strict and lenient extraction rules for ``item``'s task, in words."""
    task, style = task_for(item), _arith_style(policy)
    return {"strict": task.strict_rule(style), "lenient": task.lenient_rule(style)}


def grade_lenient(items: Sequence[EvalItem], preds: Sequence[str | None], flags: Sequence[bool],
                  lenient: Sequence[str | None], timeout_s: float = 5.0) -> list[bool]:
    """Correctness of the lenient answers; where one equals the strict answer, the strict verdict is reused."""
    out = list(flags)
    redo = [i for i, (pred, other) in enumerate(zip(preds, lenient)) if pred != other]
    for i, ok in zip(redo, grade_answers([items[i] for i in redo], [lenient[i] for i in redo], timeout_s)):
        out[i] = ok
    return out


def grade_answers(items: Sequence[EvalItem], preds: Sequence[str | None], timeout_s: float = 5.0) -> list[bool]:
    """Correctness of each prediction against its item's gold answer, graded by its task (one batch per task)."""
    correct = [False] * len(items)
    rows: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        rows[task_for(item).name].append(i)
    for indices in rows.values():
        task = task_for(items[indices[0]])
        verdicts = task.grade([preds[i] for i in indices], [items[i].answer for i in indices], timeout_s)
        for i, ok in zip(indices, verdicts):
            correct[i] = ok
    return correct


def _resolve_sets(
    sets: str | Sequence[str] | Mapping[str, Sequence[EvalItem]],
    limit: int | None, subset_seed: int, data_dir: str | os.PathLike | None,
) -> dict[str, list[EvalItem]]:
    if isinstance(sets, str):
        sets = [sets]
    if isinstance(sets, Mapping):
        return {name: list(items) for name, items in sets.items()}
    return {name: load_benchmark(name, data_dir=data_dir, limit=limit, seed=subset_seed) for name in sets}


def _by_level(items: Sequence[EvalItem], correct: Sequence[Sequence[bool]]) -> dict[str, float]:
    flags: dict[str, list[float]] = defaultdict(list)
    for item, row in zip(items, correct):
        if "level" in item.meta:
            flags[str(item.meta["level"])].append(sum(row) / len(row))
    return {level: sum(v) / len(v) for level, v in sorted(flags.items())}


def _evaluate_set(
    name: str, items: list[EvalItem], policy: Any, engine: RolloutEngine, params: SamplingParams,
    n: int, ks: list[int], batch_size: int, seed: int, timeout_s: float, bar: tqdm,
) -> tuple[dict, list[dict]]:
    start = time.perf_counter()
    prompts = [build_prompt(item, policy) for item in items]
    flat_items = [item for item in items for _ in range(n)]
    flat_prompts = [prompt for prompt in prompts for _ in range(n)]
    completions: list[Completion] = []
    bar.set_description(name)
    for batch_index, lo in enumerate(range(0, len(flat_prompts), batch_size)):
        batch = flat_prompts[lo:lo + batch_size]
        completions += engine.generate(batch, params, seed=seed + batch_index)
        bar.update(len(batch))
    # an episode's answer is read from the model's own text, never from a tool's output (as in training)
    preds = [parse_completion(item, c.written_text, policy) for item, c in zip(flat_items, completions)]
    flags = grade_answers(flat_items, preds, timeout_s)
    lenient = [parse_lenient(item, c.written_text, policy) for item, c in zip(flat_items, completions)]
    lenient_flags = grade_lenient(flat_items, preds, flags, lenient, timeout_s)

    records, per_question = [], []
    for q, (item, prompt) in enumerate(zip(items, prompts)):
        span = slice(q * n, (q + 1) * n)
        per_question.append(flags[span])
        records.append({
            "id": item.id, "prompt": prompt, "gold": item.answer,
            "completions": [c.text for c in completions[span]],
            "extracted": preds[span], "correct": flags[span],
            "extracted_lenient": lenient[span], "correct_lenient": lenient_flags[span],
            "finish_reasons": [c.finish_reason for c in completions[span]],
            "tool_calls": [c.tool_calls for c in completions[span]],
            "meta": {k: v for k, v in item.meta.items() if k != "solution"},
        })
    summary: dict[str, Any] = {
        "set": name,
        "kind": items[0].kind if items else None,
        "n_questions": len(items),
        "n_samples": n,
        "accuracy": accuracy(flags) if flags else 0.0,
        "accuracy_strict": accuracy(flags) if flags else 0.0,
        "accuracy_lenient": accuracy(lenient_flags) if lenient_flags else 0.0,
        "answer_rules": answer_rules(items[0], policy) if items else None,
        f"avg@{n}": avg_at_k(per_question) if per_question else 0.0,
        **{f"pass@{k}": mean_pass_at_k(per_question, k) if per_question else 0.0 for k in ks},
        "answered": sum(p is not None for p in preds) / len(preds) if preds else 0.0,
        "truncated": sum(c.finish_reason == "length" for c in completions) / len(completions) if completions else 0.0,
        "by_level": _by_level(items, per_question),
        "tool_call_rate": sum(c.tool_calls > 0 for c in completions) / len(completions) if completions else 0.0,
        "tool_calls_per_sample": sum(c.tool_calls for c in completions) / len(completions) if completions else 0.0,
        "tokens": sum(len(c.token_ids) for c in completions),
        "seconds": round(time.perf_counter() - start, 3),
        "sampling": {**asdict(params), "stop": list(params.stop)},
    }
    return summary, records


def out_dir_problem(out: Path) -> str | None:
    """Why results cannot be written under ``out`` (a file in the way, a folder that cannot be created or written),
    or None; reads only, so a bad ``--out`` is found before a model loads."""
    if out.exists():
        return None if out.is_dir() and os.access(out, os.W_OK | os.X_OK) else \
            f"{out} is {'not writable' if out.is_dir() else 'a file, not a folder'}"
    parent = next(p for p in out.absolute().parents if p.exists())
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable, so {out} cannot be created"
    return None


def evaluate(
    policy: Any,
    engine: RolloutEngine,
    sets: str | Sequence[str] | Mapping[str, Sequence[EvalItem]],
    *,
    preset: str = "greedy",
    n_samples: int | None = None,
    k: int | Sequence[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    seed: int = 0,
    limit: int | None = None,
    subset_seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    out_dir: str | os.PathLike | None = None,
    grade_timeout_s: float = 5.0,
    progress: bool = True,
) -> dict[str, dict]:
    """Evaluate ``policy`` (sampling through ``engine``) on each set and return per-set summaries.

    ``sets`` are registered names (loaded with ``limit``/``subset_seed``/``data_dir``; the
    subset does not depend on the sampling ``seed``, so runs with different seeds see the same
    questions) or a mapping from a name to ready items. Sampling settings default to ``EVAL_PRESETS[preset]``; any
    argument given explicitly overrides it. Temperature 0 is greedy and allows one sample.
    ``k`` lists the pass@k to report (default: powers of two up to ``n_samples``, and
    ``n_samples``). With ``out_dir``, writes ``<out_dir>/<set>/results.jsonl`` (one record per
    question), ``<out_dir>/<set>/summary.json`` and ``<out_dir>/summary.json`` (all sets).
    """
    if preset not in EVAL_PRESETS:
        raise KeyError(f"unknown evaluation preset {preset!r}; known: {', '.join(EVAL_PRESETS)}")
    base = EVAL_PRESETS[preset]
    n = base.n_samples if n_samples is None else n_samples
    params = SamplingParams(
        temperature=base.temperature if temperature is None else temperature,
        top_p=base.top_p if top_p is None else top_p,
        top_k=base.top_k if top_k is None else top_k,
        max_new_tokens=base.max_new_tokens if max_new_tokens is None else max_new_tokens,
    )
    if n < 1 or batch_size < 1:
        raise ValueError(f"n_samples and batch_size must be >= 1, got {n} and {batch_size}")
    if params.temperature <= 0 and n > 1:
        raise ValueError(f"greedy decoding (temperature 0) gives {n} identical samples; set temperature > 0")
    ks = default_ks(n) if k is None else sorted({k} if isinstance(k, int) else set(k))
    if not all(1 <= x <= n for x in ks):
        raise ValueError(f"every pass@k needs 1 <= k <= n_samples={n}, got {ks}")

    resolved = _resolve_sets(sets, limit, subset_seed, data_dir)
    out = Path(out_dir) if out_dir is not None else None
    summaries: dict[str, dict] = {}
    total = sum(len(items) for items in resolved.values()) * n
    with tqdm(total=total, disable=not progress, unit="sample", dynamic_ncols=True) as bar:
        for name, items in resolved.items():
            summary, records = _evaluate_set(name, items, policy, engine, params, n, ks, batch_size, seed,
                                             grade_timeout_s, bar)
            summary["preset"] = preset
            summaries[name] = summary
            if out is not None:
                folder = out / name
                folder.mkdir(parents=True, exist_ok=True)
                atomic_write_text(folder / "results.jsonl",
                              "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                atomic_write_text(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
                atomic_write_text(out / "summary.json", json.dumps(summaries, indent=2) + "\n")
    return summaries
