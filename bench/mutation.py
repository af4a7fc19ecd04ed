"""Mutation benchmark: does the test suite fail when the code is wrong?

Each mutation below is one small, meaningful wrong change to the code (a text replacement in one file). The script
copies the working tree to a scratch folder, applies one mutation at a time there, runs the test files mapped to it
(``pytest -x``, so a caught mutation stops at its first failing test) and restores the file. A mutation is *caught*
when those tests fail, *survives* when they pass; a run past ``--timeout`` counts as caught and is listed apart.
Before any mutation the mapped tests run once on the unmutated copy and must pass. A mutation whose text is no longer
in the code (the code moved on) is *stale*: it is reported, and the script exits 1, so the list is kept in step.

    .venv/bin/python bench/mutation.py                     # every mutation (10-25 min on 2 cores)
    .venv/bin/python bench/mutation.py --list              # names, files and mapped tests
    .venv/bin/python bench/mutation.py --smoke             # every mutation still applies (seconds, no tests run)
    .venv/bin/python bench/mutation.py --only kl_dropped tis_dropped --no-baseline
    .venv/bin/python bench/mutation.py --tests-at 60343e0  # an older commit's tests against today's code

The scratch copy imports its own ``coevolve`` (it comes first on ``PYTHONPATH``), and the quick tiny-arith test build
is kept in ``COEVOLVE_TEST_CACHE`` across the pytest runs (a scratch folder unless that is set). Output: one line per
mutation, the score with the survivors, and ``bench/results/mutation.json``. Survivors are explained in
``bench/README.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from speed import RESULTS_DIR, machine_info, run_header, warn_if_busy, write_json

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (found exactly once in ``path``) by ``new``; ``tests`` are the pytest arguments that should
    catch it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


TRAINER, LOSSES, DIST = "coevolve/rl/trainer.py", "coevolve/rl/losses.py", "coevolve/distributed.py"
STORE, LOOP = "coevolve/store.py", "coevolve/loop.py"
WIRING = ("tests/rl/test_trainer_loss.py", "tests/rl/test_trainer.py")
RESUME = ("tests/test_resume.py",)
TWO_PROCESSES = ("tests/test_distributed.py::test_two_processes_train_the_same_weights_as_one",)
SOURCES, TTRL = ("tests/recipes/test_source_fidelity.py",), ("tests/recipes/test_ttrl.py",)

MUTATIONS: tuple[Mutation, ...] = (
    # --- the connecting code (recipes, trainer, store, distribution) ---------------------------------------
    Mutation("grpo_reward_inverted", "coevolve/recipes/grpo.py", "rewards = [float(self.task.is_correct(",
             "rewards = [float(not self.task.is_correct(", ("tests/recipes/test_grpo.py",)),
    Mutation("kl_dropped", TRAINER, "beta=st.kl_beta,", "beta=0.0,", WIRING),
    Mutation("tis_dropped", TRAINER, "tis_cap=st.tis_cap,", "tis_cap=None,", WIRING),
    Mutation("clip_bounds_swapped_in_trainer", TRAINER,
             "clip_low=st.clip_low, clip_high=_clip_high(part, st.clip_high),",
             "clip_low=st.clip_high, clip_high=_clip_high(part, st.clip_low),", WIRING),
    Mutation("clip_bounds_swapped_in_loss", LOSSES,
             "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)",
             "torch.clamp(ratio, 1.0 - clip_high, 1.0 + clip_low)",
             ("tests/rl/test_losses.py",)),
    Mutation("pasodoble_leak_check_unapplied", "coevolve/recipes/pasodoble.py",
             'x.leak = p.leak_filter != "off" and leaks_answer(x.question, x.answer, p.leak_filter)', "x.leak = False",
             ("tests/recipes/test_pasodoble.py",)),
    Mutation("adamw_state_not_restored", STORE, "                optimizer.load_state_dict(saved)",
             "                pass", RESUME),
    Mutation("rzero_answered_denominator_ignored", "coevolve/recipes/r_zero.py",
             'q.p = q.vote.p if denominator == "all" else', "q.p = q.vote.p if True else",
             ("tests/recipes/test_r_zero.py",)),
    Mutation("infuser_influence_sign_flipped", "coevolve/recipes/infuser.py",
             "x.influence, x.grad_norm = s.score, s.grad_norm", "x.influence, x.grad_norm = -s.score, s.grad_norm",
             ("tests/recipes/test_infuser.py",)),
    Mutation("gradients_averaged_over_ranks", DIST, "        dist.all_reduce(p.grad)\n",
             "        dist.all_reduce(p.grad)\n        p.grad /= world_size()\n", TWO_PROCESSES),
    # --- the pure formulas -------------------------------------------------------------------------------
    Mutation("advantage_std_biased", "coevolve/rl/advantages.py", "dof = count - 1.0 if unbiased else count",
             "dof = count if unbiased else count - 1.0", ("tests/rl/test_advantages.py",)),
    Mutation("vote_tie_goes_to_last", "coevolve/grading/vote.py", "best = max(range(len(sizes)), key=",
             "best = max(reversed(range(len(sizes))), key=", ("tests/grading/test_grading.py", "-k", "majority_vote")),
    Mutation("rzero_reward_unclamped", "coevolve/rewards/uncertainty.py",
             "max(0.0, uncertainty_reward(p) - penalty)", "uncertainty_reward(p) - penalty",
             ("tests/rewards/test_rewards_prism.py", "tests/recipes/test_r_zero.py")),
    Mutation("pool_band_upper_bound_ignored", "coevolve/recipes/r_zero.py", "in_band(q.p, *self.pool_band)",
             "in_band(q.p, self.pool_band[0], 1.0)", ("tests/recipes/test_r_zero.py",)),
    Mutation("pasodoble_offset_dropped", "coevolve/rewards/pasodoble.py", "return (offset - p) + w * r_div",
             "return (1.0 - p) + w * r_div", ("tests/recipes/test_pasodoble.py",)),
    Mutation("prism_rarity_over_total", "coevolve/rewards/coverage.py", "mean = max(float(counts.mean()), 1e-8)",
             "mean = max(float(counts.sum()), 1e-8)",
             ("tests/rewards/test_rewards_prism.py", "tests/recipes/test_prism.py")),
    Mutation("opensir_selects_lowest", "coevolve/rewards/novelty.py", "key=lambda i: -scores[i])",
             "key=lambda i: scores[i])", ("tests/rewards/test_rewards_opensir.py", "tests/recipes/test_opensir.py")),
    Mutation("dynamic_rl_overlap_counted_once", "coevolve/rewards/similarity.py",
             "            totals[k] += s\n", "",
             ("tests/rewards/test_rewards_dynamic_rl.py", "tests/recipes/test_dynamic_rl.py")),
    # --- losses --------------------------------------------------------------------------------------------------
    Mutation("k3_direction_reversed", LOSSES, "d = ref_logprobs - logprobs", "d = logprobs - ref_logprobs",
             ("tests/rl/test_losses.py",)),
    Mutation("token_mean_over_micro_batch", LOSSES,
             "denom = float(total_tokens) if total_tokens is not None else", "denom = None if True else",
             ("tests/rl/test_losses.py",)),
    Mutation("entropy_bonus_sign_flipped", LOSSES, "loss_tok = loss_tok - entropy_coef * masked(entropy)",
             "loss_tok = loss_tok + entropy_coef * masked(entropy)", ("tests/rl/test_losses.py",)),
    Mutation("tis_weight_uncapped", LOSSES, "weight = torch.clamp(raw_w, max=tis_cap)", "weight = raw_w",
             ("tests/rl/test_losses.py",)),
    # --- trainer -------------------------------------------------------------------------------------------------
    Mutation("epochs_ignored", TRAINER, "for _ in range(st.epochs):", "for _ in range(1):", WIRING),
    Mutation("pi_old_is_current_policy", TRAINER, "old = None if single_step else", "old = None if True else",
             WIRING),
    Mutation("temperature_ignored_in_update", TRAINER,
             "completion_logprobs(self.model, part, self.pad_id, st.temperature,",
             "completion_logprobs(self.model, part, self.pad_id, 1.0,", WIRING),
    Mutation("entropy_bonus_dropped", TRAINER, "entropy=entropy, entropy_coef=st.entropy_coef,",
             "entropy=entropy, entropy_coef=0.0,", WIRING),
    Mutation("grad_clip_ignored", TRAINER, "st.grad_clip if st.grad_clip > 0 else math.inf", "math.inf", WIRING),
    Mutation("micro_batches_normalised_alone", TRAINER,
             'agg_totals = {"total_tokens": total_tokens, "total_sequences": len(batch)}', "agg_totals = {}", WIRING),
    Mutation("reference_follows_policy", TRAINER, "self._frozen_logprobs(self.reference, samples)",
             "self._frozen_logprobs(self.model, samples)", WIRING),
    # --- vote ----------------------------------------------------------------------------------------------------
    Mutation("vote_p_over_answered", "coevolve/grading/vote.py", "p=sizes[best] / n,", "p=sizes[best] / n_valid,",
             ("tests/grading/test_grading.py", "-k", "majority_vote")),
    # --- recipes -------------------------------------------------------------------------------------------------
    Mutation("opensir_parsed_denominator_ignored", "coevolve/recipes/opensir.py",
             'if self.params.solve_rate_denominator == "group":', "if True:", ("tests/recipes/test_opensir.py",)),
    Mutation("infuser_dev_gradient_sign_flipped", "coevolve/recipes/infuser.py",
             'halves[i in second].extend(train_samples(group, compute_advantages("dr_grpo", r, [0] * len(r))))',
             'halves[i in second].extend(train_samples(group, [-a for a in compute_advantages("dr_grpo", r, '
             '[0] * len(r))]))',
             ("tests/recipes/test_infuser.py",)),
    Mutation("rzero_solver_reward_weights_swapped", "coevolve/recipes/r_zero.py",
             '(1 - p.solver_format_weight) * x["agree"] + p.solver_format_weight * x["format"]',
             'p.solver_format_weight * x["agree"] + (1 - p.solver_format_weight) * x["format"]',
             ("tests/recipes/test_r_zero.py",)),
    Mutation("influence_not_preconditioned_by_root", "coevolve/rl/influence.py", "direction.sqrt_().add_(eps)",
             "direction.add_(eps)", ("tests/rl/test_influence.py",)),
    # --- store and resume ----------------------------------------------------------------------------------------
    Mutation("metrics_of_lost_steps_kept", STORE, 'rows = [r for r in self.metrics() if r.get("step", -1) <= step]',
             "rows = self.metrics()", RESUME),
    Mutation("updates_done_not_restored", LOOP, "trainer.updates_done = updates_done[role]", "pass", RESUME),
    Mutation("recipe_state_not_restored", LOOP, 'recipe.load_state_dict(state["loop_recipe"])', "pass",
             ("tests/recipes/test_r_zero.py", "-k", "resume")),
    Mutation("checkpoints_pruned_one_late", STORE, "for old in self.checkpoint_steps()[:-keep]:",
             "for old in self.checkpoint_steps()[:-keep - 1]:", RESUME),
    # --- distribution --------------------------------------------------------------------------------------------
    Mutation("rank_samples_with_the_call_seed", "coevolve/rollout/wrappers.py", "seed + start * PROMPT_SEED_STRIDE",
             "seed",
             TWO_PROCESSES),
    Mutation("every_rank_trains_the_whole_mini_batch", TRAINER,
             "first, last = distributed.shard_bounds(len(indices))", "first, last = 0, len(indices)", TWO_PROCESSES),
    Mutation("fsdp_gradients_averaged", DIST, "        unit.set_gradient_divide_factor(1.0)\n", "",
             ("tests/test_distributed.py::test_fsdp_run_killed_and_resumed_trains_the_same_weights_as_one",)),
    # --- issue 26: the sources' settings; strict and lenient evaluation ------------------------------------------
    Mutation("dual_clip_not_passed", TRAINER, "dual_clip=st.dual_clip,", "dual_clip=None,", SOURCES),
    Mutation("dual_clip_caps_positive_advantages", LOSSES, "dual_active = (adv < 0) & (loss_tok > -dual_clip * adv)",
             "dual_active = (adv != 0) & (loss_tok > -dual_clip * adv)", ("tests/rl/test_losses.py",)),
    Mutation("adamw_kept_across_phases", TRAINER, 'if index == 0 and self.settings.optimizer_reset == "phase":',
             "if False:", SOURCES),
    Mutation("cosine_decays_to_zero", TRAINER,
             "return settings.lr_min_ratio + (1 - settings.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))",
             "return 0.5 * (1 + math.cos(math.pi * progress))", SOURCES),
    Mutation("lr_warmup_skipped", TRAINER, "    if index < warmup:\n        return index / warmup\n", "", SOURCES),
    Mutation("scoring_votes_sampled_as_training", "coevolve/recipes/r_zero.py",
             "sampling or self.scoring_sampling, tools=tools)", "sampling or self.solver_sampling, tools=tools)",
             SOURCES),
    Mutation("pool_top_p_ignored", "coevolve/recipes/r_zero.py",
             "top_p=params.pool_top_p or self.sampling.top_p", "top_p=self.sampling.top_p", SOURCES),
    Mutation("pasodoble_skips_flat_batches_always", "coevolve/recipes/pasodoble.py",
             "flat = self.params.skip_zero_advantages and not any(", "flat = not any(", SOURCES),
    Mutation("pasodoble_runs_past_max_updates", "coevolve/recipes/pasodoble.py",
             "        return self.params.max_updates is not None and self.updates >= self.params.max_updates\n",
             "        return False\n", SOURCES),
    Mutation("lenient_keeps_thousands_commas", "coevolve/grading/extract.py",
             'value = number.group().replace(",", "")', "value = number.group()",
             ("tests/evaluation/test_strict_lenient.py",)),
    Mutation("lenient_box_loses_to_an_earlier_number", "coevolve/grading/extract.py",
             "box[1] > number.start()", "box[1] < number.start()", ("tests/evaluation/test_strict_lenient.py",)),
    # --- issue 27: TTRL --------------------------------------------------------------------------------------------
    Mutation("ttrl_tie_goes_to_first", "coevolve/rewards/majority.py",
             "best = tied[0] if len(tied) == 1 else random.Random(seed).choice(tied)", "best = tied[0]", TTRL),
    Mutation("ttrl_rewards_all_samples", "coevolve/recipes/ttrl.py", "rewards = agreement_rewards(vote, trained)",
             "rewards = agreement_rewards(vote, range(len(answers)))", TTRL),
    Mutation("ttrl_margin_over_answered", "coevolve/rewards/majority.py",
             "return (sizes[0] - (sizes[1] if len(sizes) > 1 else 0)) / vote.n",
             "return (sizes[0] - (sizes[1] if len(sizes) > 1 else 0)) / sum(sizes)", TTRL),
    Mutation("collapse_without_reward_rise", "coevolve/analytics/collapse.py",
             "if after and before and fmean(after) > fmean(before):", "if True:", TTRL),
)


@dataclass
class Outcome:
    """What the mapped tests made of one mutation."""

    name: str
    status: str  # caught | survived | timeout | stale
    seconds: float
    detail: str  # the failing test, or why the mutation is stale


def scratch_copy(destination: Path, tests_at: str | None) -> None:
    """The working tree (tracked and untracked files git does not ignore) copied to ``destination``, with
    ``tests/`` as of the commit ``tests_at`` when given; the shared data folder beside it, as beside the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not (tests_at and name.startswith("tests/")):
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if tests_at:
        archive = subprocess.run(["git", "archive", tests_at, "tests"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(destination)], input=archive.stdout, check=True)
    if (ROOT.parent / "shared").is_dir():
        (destination.parent / "shared").symlink_to(ROOT.parent / "shared")


def run_tests(scratch: Path, args: tuple[str, ...], env: dict[str, str], timeout: float) -> tuple[str, str]:
    """("passed" | "failed" | "timeout", the first failing test or the last output line) of ``pytest -x ARGS``;
    test files that do not exist are left out, and with none left nothing can fail ("passed")."""
    args = tuple(a for a in args if not a.startswith("tests/") or (scratch / a.split("::")[0]).is_file())
    if not any(a.startswith("tests/") for a in args):
        return "passed", "no mapped test file exists"
    # -n 0: in one process, as the figures in bench/README.md were measured (the suite's default is 2 workers)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *args]
    with subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as pytest:
        try:
            output, _ = pytest.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # pytest and every run it started (torchrun's ranks have own sessions)
            for process in [*psutil.Process(pytest.pid).children(recursive=True), psutil.Process(pytest.pid)]:
                process.kill()
            pytest.communicate()
            return "timeout", f"over {timeout:.0f} s"
    lines = output.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return ("passed" if pytest.returncode == 0 else "failed"), (failed[0] if failed else (lines[-1] if lines else ""))


def apply(scratch: Path, mutation: Mutation) -> str | None:
    """Write the mutated file into the scratch copy; returns the original text, or None when the mutation is stale."""
    path = scratch / mutation.path
    text = path.read_text()
    if text.count(mutation.old) != 1:
        return None
    path.write_text(text.replace(mutation.old, mutation.new))
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the mapped tests unmutated")
    parser.add_argument("--tests-at", metavar="COMMIT", help="score the tests of this commit against today's code")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    parser.add_argument("--smoke", action="store_true", help="check that every mutation's text is found once and its "
                        "tests exist, without running them (seconds: what the test suite runs)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "mutation.json")
    return parser.parse_args(argv)


def smoke(chosen: list[Mutation], out: Path) -> int:
    """Every chosen mutation applies (its text is in its file exactly once) and its mapped test files exist."""
    stale = [m.name for m in chosen if (ROOT / m.path).read_text().count(m.old) != 1]
    missing = sorted({t.split("::")[0] for m in chosen for t in m.tests
                      if t.startswith("tests/") and not (ROOT / t.split("::")[0]).exists()})
    print(f"{len(chosen)} mutations: {len(stale)} stale ({', '.join(stale) or 'none'}), "
          f"missing test files: {', '.join(missing) or 'none'}")
    write_json(out, {**run_header(), "smoke": True, "mutations": len(chosen), "stale": stale,
                     "missing_tests": missing})
    return 1 if stale or missing else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    known = {m.name for m in MUTATIONS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        raise SystemExit(f"unknown mutation(s): {', '.join(unknown)}")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:42s} {m.path:34s} {' '.join(m.tests)}")
        return 0
    if args.smoke:
        return smoke(chosen, args.out)
    warn_if_busy()
    machine, started = machine_info(), time.perf_counter()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="coevolve-mutation-") as tmp:
        scratch = Path(tmp) / "tree"
        scratch_copy(scratch, args.tests_at)
        env = {**os.environ, "PYTHONPATH": str(scratch), "OMP_NUM_THREADS": "1",
               "COEVOLVE_TEST_CACHE": os.environ.get("COEVOLVE_TEST_CACHE") or str(Path(tmp) / "models")}
        if not args.no_baseline:  # plain test paths in one run, each selection with options (-k) on its own
            plain = [t for m in chosen if not any(a.startswith("-") for a in m.tests) for t in m.tests]
            files = [t for t in plain if "::" not in t]
            runs = [tuple(dict.fromkeys(files + [t for t in plain if t.split("::")[0] not in files]))]
            runs += list(dict.fromkeys(m.tests for m in chosen if any(a.startswith("-") for a in m.tests)))
            for tests in runs:
                result, detail = run_tests(scratch, tests, env, args.timeout * 4)
                print(f"baseline (unmutated) {' '.join(tests)}: {result} {detail}", flush=True)
                if result != "passed":
                    return 1
        for m in chosen:
            began = time.perf_counter()
            original = apply(scratch, m)
            if original is None:
                outcomes.append(Outcome(m.name, "stale", 0.0, f"the text to replace is not found once in {m.path}"))
            else:
                try:
                    result, detail = run_tests(scratch, m.tests, env, args.timeout)
                finally:
                    (scratch / m.path).write_text(original)
                status = {"failed": "caught", "passed": "survived", "timeout": "timeout"}[result]
                outcomes.append(Outcome(m.name, status, time.perf_counter() - began, detail))
            o = outcomes[-1]
            print(f"{o.status:9s} {o.seconds:6.0f} s  {o.name:42s} {o.detail}", flush=True)
    caught = [o for o in outcomes if o.status in ("caught", "timeout")]
    judged = [o for o in outcomes if o.status != "stale"]
    survivors = [o.name for o in outcomes if o.status == "survived"]
    stale = [o.name for o in outcomes if o.status == "stale"]
    score = len(caught) / len(judged) if judged else float("nan")
    total = time.perf_counter() - started
    print(f"\nmutation score: {len(caught)}/{len(judged)} caught ({100 * score:.0f}%) in {total / 60:.1f} min")
    print(f"survivors: {', '.join(survivors) or 'none'}")
    if stale:
        print(f"stale (the code moved on; update MUTATIONS): {', '.join(stale)}")
    write_json(args.out, {**run_header(), "machine": machine, "load_avg_end": list(os.getloadavg()),
                          "seconds": round(total, 1), "score": score, "caught": len(caught), "judged": len(judged),
                          "survivors": survivors, "stale": stale,
                          "mutations": [{**asdict(m), "tests": list(m.tests)} for m in chosen],
                          "outcomes": [asdict(o) for o in outcomes]})
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
