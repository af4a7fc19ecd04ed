"""The self-evolving loop on a real chat model (smollm2-135m): generator format validity with and without format help,
then short runs with the best help and GSM8K evaluation before and after.

    python -m experiments.real_lm.run sft      # the format warm-ups (one per output format)
    python -m experiments.real_lm.run valid    # valid-rate table: recipe x {none, examples, constraint, sft}
    python -m experiments.real_lm.run short    # 5-step runs with the best help, GSM8K-100 before / after
    python -m experiments.real_lm.run short --recipes pasodoble --help-option sft+constraint   # another help
    python -m experiments.real_lm.run report   # results.md / results.json from what finished

Everything goes to experiments/real_lm/runs/ (not in git); a finished piece is skipped when run again. ``--jobs N``
runs N pieces at a time, each on one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = Path(os.environ.get("REAL_LM_RUNS", HERE / "runs"))
STEPS = int(os.environ.get("REAL_LM_STEPS", "5"))  # short-run length
RECIPES = ["r_zero", "prism", "pasodoble", "infuser", "opensir", "dynamic_rl"]
FORMAT_OF = {"prism": "r_zero"}  # prism's questioner prompt, format and parser are r_zero's: one warm-up serves both
OPTIONS = ["none", "examples", "constraint", "both", "sft"]  # both: examples and constraint
SAMPLES = 64
# Generator tokens in the valid-rate measurement: room for the longest output the format's regex allows (a 300-
# character question; PasoDoble's also a 300-character solution, OpenSIR's a note and concepts).
BUDGETS = {"pasodoble": 224, "opensir": 160}
BUDGET = 128
COMMON = ["model=smollm2-135m", "task=math", "eval_sets=[]", "rollout.batch_size=64"]
# Generator token budget per recipe (its own key), and the keys that keep recipe start-up small.
GENERATOR_KEYS = {
    "r_zero": ["params.question_max_tokens={b}"],
    "prism": ["params.question_max_tokens={b}", "params.k=16"],
    "pasodoble": ["params.proposer_max_tokens={b}", "params.knowledge_pool_size=200"],
    "infuser": ["params.generator_max_tokens={b}", "params.document_pool_size=200", "params.dev_size=8",
                "params.document_min_tokens=100", "params.document_max_tokens=512"],
    "opensir": ["rollout.max_new_tokens={b}"],
    "dynamic_rl": ["params.question_max_tokens={b}"],
}
OPTION_KEYS = {"none": [], "examples": ["params.format_examples=2"], "constraint": ["params.format_constraint=true"],
               "both": ["params.format_examples=2", "params.format_constraint=true"]}
SFT_KEYS = ["examples=64", "steps=16", "batch_size=4", "lr=5e-5", "max_tokens=448", "threads=1"]


def sft_dir(recipe: str) -> Path:
    return RUNS / "sft" / FORMAT_OF.get(recipe, recipe)


def option_sets(recipe: str, option: str) -> list[str]:
    """The config keys of ``option``; options joined with ``+`` (``sft+constraint``) combine."""
    if "+" in option:
        return [key for part in option.split("+") for key in option_sets(recipe, part)]
    if option == "sft":
        return [f"params.generator_init={sft_dir(recipe)}"]
    return OPTION_KEYS[option]


def budget(recipe: str) -> int:
    return BUDGETS.get(recipe, BUDGET)


def generator_batch(recipe, n: int, seed: int):
    """(policy, prompts, sampling, is_valid) of one generator step of ``recipe``, as its step builds them."""
    name = recipe.name
    if name in ("r_zero", "prism"):
        return (recipe.questioner, [recipe.question_prompt] * n, recipe.question_sampling,
                lambda c, i: recipe.read_question(c).text is not None)
    if name == "pasodoble":
        passages = recipe.knowledge.sample(seed, n)
        return (recipe.proposer, [recipe.proposer_prompt(k) for k in passages], recipe.proposer_sampling,
                lambda c, i: all(recipe.read_proposal(c.text, passages[i])))
    if name == "infuser":
        docs = recipe.documents.take(seed, 0, n)
        return (recipe.generator, [recipe.generator_prompt(d) for d in docs], recipe.question_sampling,
                lambda c, i: recipe.read_generation(c.text, docs[i])[0] is not None)
    if name == "opensir":
        reference = recipe.pool.sample(random.Random(seed), 1)[0]  # step 1: the seed problem
        return (recipe.teacher, [recipe.teacher_prompt(reference)] * n, recipe.teacher_sampling,
                lambda c, i: recipe.read_problem(c.text).valid)
    return (recipe.policy, [recipe.z0] * n, recipe.question_sampling,
            lambda c, i: recipe.parse_question(c) is not None)


def valid_cell(recipe_name: str, option: str, out: Path, samples: int = SAMPLES, seed: int = 0) -> None:
    """Sample ``samples`` generator outputs with ``option`` and write the share that the recipe's parser accepts."""
    import torch

    torch.set_num_threads(1)
    from coevolve.recipes import resolve

    keys = [k.format(b=budget(recipe_name)) for k in GENERATOR_KEYS[recipe_name]]
    cfg, params, cls = resolve(recipe_name, sets=COMMON + keys + option_sets(recipe_name, option))
    started = time.perf_counter()
    recipe = cls(cfg, params)
    load_s = time.perf_counter() - started
    policy, prompts, sampling, is_valid = generator_batch(recipe, samples, seed)
    started = time.perf_counter()
    outputs = recipe.engine(policy).generate(prompts, sampling, seed)
    sample_s = time.perf_counter() - started
    valid = [bool(is_valid(c, i)) for i, c in enumerate(outputs)]
    result = {"recipe": recipe_name, "option": option, "samples": samples, "valid": sum(valid),
              "valid_rate": sum(valid) / samples, "max_new_tokens": sampling.max_new_tokens,
              "temperature": sampling.temperature, "length_stops": sum(c.finish_reason == "length" for c in outputs),
              "mean_tokens": sum(len(c.token_ids) for c in outputs) / samples, "load_s": round(load_s, 1),
              "sample_s": round(sample_s, 1),
              "first_valid": next((c.text for c, v in zip(outputs, valid) if v), None),
              "first_invalid": next((c.text for c, v in zip(outputs, valid) if not v), None)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


# Short runs: sizes small enough for minutes a step on 2 cores, with the solver reached within the 5 steps.
SHORT = {
    "r_zero": ["params.questioner_steps=2", "params.solver_steps=3", "params.questioner_prompts=2",
               "params.questioner_group=4", "params.score_samples=4", "params.pool_size=8", "params.label_samples=4",
               "params.solver_questions=4", "params.solver_group=4", "params.band=[0.0,1.0]",
               "params.question_max_tokens=128", "rollout.max_new_tokens=64"],
    "prism": ["params.questioner_steps=2", "params.solver_steps=3", "params.questioner_prompts=2",
              "params.questioner_group=4", "params.score_samples=4", "params.pool_size=8", "params.label_samples=4",
              "params.solver_questions=4", "params.solver_group=4", "params.band=[0.0,1.0]", "params.k=16",
              "params.question_max_tokens=128", "rollout.max_new_tokens=128"],
    "pasodoble": ["params.passages_per_step=2", "params.proposals=4", "params.solutions=6", "params.tau_low=0.0",
                  "params.knowledge_pool_size=200", "params.proposer_max_tokens=224", "rollout.max_new_tokens=128"],
    "infuser": ["params.documents_per_step=2", "params.group_size=4", "params.minibatch_prompts=2",
                "params.dev_size=4", "params.document_pool_size=200", "params.document_min_tokens=100",
                "params.document_max_tokens=512", "params.generator_max_tokens=128", "rollout.max_new_tokens=128"],
    "opensir": ["params.batch_size=16", "params.group_size=4", "params.teacher_upscale=1",
                "rollout.max_new_tokens=160", "params.l_base=160", "params.l_cap=160"],
    "dynamic_rl": ["params.n=8", "params.m=4", "params.question_max_tokens=128", "rollout.max_new_tokens=64"],
}
# The help of a short run: the best valid rate, except where the loop needs more than a valid format (see README);
# the solver's answer format is constrained too (a 135M solver rarely boxes its answer, so there is no label).
SHORT_HELP: dict[str, str] = {"pasodoble": "both", "infuser": "both"}
SOLVER_HELP = ["params.solver_format_constraint=true"]
EVAL = ["--sets", "gsm8k", "--limit", "100", "--max-new-tokens", "256"]  # 128 cut off 94 of 100 base answers


def best_option(recipe: str) -> str:
    """The option with the highest measured valid rate (ties: constraint, both, examples, sft, none)."""
    if recipe in SHORT_HELP:
        return SHORT_HELP[recipe]
    rates = {}
    for option in OPTIONS:
        path = RUNS / "valid" / f"{recipe}-{option}.json"
        if path.exists():
            rates[option] = json.loads(path.read_text())["valid_rate"]
    if not rates:
        return "constraint"
    order = ["constraint", "both", "examples", "sft", "none"]
    return max(rates, key=lambda o: (rates[o], -order.index(o)))


def _python(args: list[str], log: Path) -> list[str]:
    return ["bash", "-c", f"OMP_NUM_THREADS=1 {sys.executable} {' '.join(args)} > {log} 2>&1"]


def jobs_for(stage: str, recipes: list[str], options: list[str], short_help: str | None = None
             ) -> list[tuple[Path, list[str]]]:
    """(marker file that says it is done, command) of each piece of ``stage``; ``short_help`` replaces the best
    option of the short runs (their folders are then named ``<recipe>-<help>``)."""
    jobs = []
    if stage == "sft":
        for recipe in dict.fromkeys(FORMAT_OF.get(r, r) for r in recipes):
            out = sft_dir(recipe)
            sets = " ".join(f"--set {k}" for k in SFT_KEYS)
            jobs.append((out / "summary.json", _python(
                [f"-m coevolve sft {recipe} {sets} --quiet --out {out}"], RUNS / "logs" / f"sft-{recipe}.log")))
    elif stage == "valid":
        for recipe in recipes:
            for option in options:
                out = RUNS / "valid" / f"{recipe}-{option}.json"
                jobs.append((out, _python([f"-m experiments.real_lm.run cell {recipe} {option} {out}"],
                                          RUNS / "logs" / f"valid-{recipe}-{option}.log")))
    elif stage == "short":
        base = RUNS / "eval" / "base"
        jobs.append((base / "summary.json", _python(
            ["-m coevolve eval smollm2-135m", *EVAL, "--out", str(base)], RUNS / "logs" / "eval-base.log")))
        for recipe in recipes:
            option = short_help or best_option(recipe)
            run_dir = RUNS / "short" / (f"{recipe}-{short_help}" if short_help else recipe)
            sets = " ".join(f"--set {k}" for k in COMMON + SHORT[recipe] + option_sets(recipe, option) + SOLVER_HELP
                            + [f"steps={STEPS}"])
            command = (f"-m coevolve run {recipe} {sets} --quiet --out {run_dir} && OMP_NUM_THREADS=1 "
                       f"{sys.executable} -m coevolve eval {run_dir} {' '.join(EVAL)} --out {run_dir}/eval_after")
            jobs.append((run_dir / "eval_after" / "summary.json",
                         _python([command], RUNS / "logs" / f"short-{run_dir.name}.log")))
    return jobs


def run_jobs(jobs: list[tuple[Path, list[str]]], parallel: int) -> None:
    """Run the pieces not yet done, ``parallel`` at a time."""
    (RUNS / "logs").mkdir(parents=True, exist_ok=True)
    pending = [(marker, cmd) for marker, cmd in jobs if not marker.exists()]
    running: list[tuple[Path, subprocess.Popen, float]] = []
    while pending or running:
        while pending and len(running) < parallel:
            marker, cmd = pending.pop(0)
            print(f"start {marker.relative_to(RUNS)}", flush=True)
            running.append((marker, subprocess.Popen(cmd, cwd=HERE.parents[1]), time.time()))
        time.sleep(2)
        for item in list(running):
            marker, proc, started = item
            if proc.poll() is not None:
                running.remove(item)
                state = "done" if marker.exists() else f"FAILED (exit {proc.returncode})"
                print(f"{state} {marker.relative_to(RUNS)} in {time.time() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["sft", "valid", "short", "report", "cell"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--options", default=",".join(OPTIONS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--help-option", help="short runs: this help instead of the best one (e.g. sft+constraint)")
    args = parser.parse_args()
    if args.stage == "cell":  # one valid-rate measurement: recipe option out [samples]
        recipe, option, out, *samples = args.rest
        valid_cell(recipe, option, Path(out), int(samples[0]) if samples else SAMPLES)
        return
    if args.stage == "report":
        from experiments.real_lm.report import write_report

        print(write_report(RUNS, HERE))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_jobs(jobs_for(args.stage, args.recipes.split(","), args.options.split(","), args.help_option), args.jobs)


if __name__ == "__main__":
    main()
