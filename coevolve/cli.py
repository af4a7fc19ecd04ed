"""Command line: ``coevolve run | sft | eval | export | recipes | report | compare``."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NoReturn

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Self-evolving reasoning: a generator writes questions, a solver learns to answer them.")


MAX_ERROR_CHARS = 500


def _fail(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` as one ``error:`` line (newlines folded, at most MAX_ERROR_CHARS) and exit with ``code``."""
    line = " ".join(str(message).splitlines())
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 3] + "..."
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops as on Ctrl-C."""


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`_Terminated`; the previous handler is restored after."""
    def handler(signum, frame):
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.callback()
def _registry(ctx: typer.Context) -> None:
    """Every command that names a recipe first loads the registry: the built-in recipes and those of installed
    packages (a name taken twice or an entry point that does not load is one error line, exit 2)."""
    if ctx.invoked_subcommand in ("recipes", "run", "sft", "eval", "export"):
        from coevolve.config import ConfigError

        try:
            import coevolve.recipes  # noqa: F401
        except ConfigError as exc:
            _fail(str(exc), 2)


@app.command()
def recipes() -> None:
    """List the recipes, one line each."""
    from coevolve.recipes import RECIPES

    for name in sorted(RECIPES):
        cls = RECIPES[name]
        presets = ",".join(sorted(cls.presets)) or "-"
        typer.echo(f"{name:<12} {cls.summary}  [presets: {presets}]")


@app.command()
def run(
    recipe: str | None = typer.Argument(None, help="recipe name (see `coevolve recipes`)"),
    preset: str | None = typer.Option(None, "--preset", help="named defaults shipped with the recipe"),
    config: Path | None = typer.Option(None, "--config", help="YAML config file"),
    set_: list[str] = typer.Option([], "--set", help="override a key: --set train.lr=1e-4 (repeatable)"),
    out: str | None = typer.Option(None, "--out", help="run directory: absent or empty (default "
                                      "runs/<recipe>-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run in --out (removes only what a run "
                                   "wrote there)"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this directory"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="let the model folder's own Python "
                                           "code run (needed whatever the config says)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    processes: int = typer.Option(1, "--processes", min=1, help="data-parallel processes on this machine "
                                  "(started with torchrun; one GPU each on CUDA)"),
    print_config: bool = typer.Option(False, "--print-config", help="print the resolved config as config.yaml "
                                      "would hold it (with what each role runs) and exit"),
    help_config: bool = typer.Option(False, "--help-config", help="print every setting (core and params.*) with its "
                                     "resolved value and what it does, and exit"),
) -> None:
    """Train with a recipe; everything the run produces goes to its run directory."""
    from coevolve import distributed
    from coevolve.config import ConfigError, check_runtime, settings_help
    from coevolve.documents import DocumentError
    from coevolve.loop import NonFiniteWeights, NothingTrained
    from coevolve.loop import run as run_loop
    from coevolve.models import ModelNotFoundError, prepare_builtin
    from coevolve.recipes import resolve, resolve_saved
    from coevolve.records import accuracy_line
    from coevolve.rollout.vllm_engine import EngineUnavailable, PromptTooLong, require_vllm
    from coevolve.rundir import RunDirError, check_run_dir, claim_run_dir
    from coevolve.store import CheckpointDamaged, RunStore
    from coevolve.tasks.registry import TaskDataError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:  # everything that can be checked, before anything is written or loaded
        if resume is not None:
            if overwrite:
                _fail("--overwrite starts a new run; it does not combine with --resume", 2)
            check_run_dir(resume, resume=True)
            cfg, params, cls = resolve_saved(str(resume / "config.yaml"), set_)
            if recipe is not None and recipe != cfg.recipe:
                _fail(f"{resume} holds a {cfg.recipe} run, not {recipe}", 2)
            held = max(RunStore(resume).checkpoint_steps(), default=0)
            trained = _trained_by(RunStore(resume), held, cfg.recipe, cls.roles)
            if trained:
                _fail(f"{resume}/config.yaml names recipe {cfg.recipe}, but the run's checkpoints were written by "
                      f"{trained}: the config's recipe differs from the run's; put back the recipe it trained", 2)
            if cfg.steps < held:
                _fail(f"{resume} already holds {held} completed steps, more than steps={cfg.steps}; --resume "
                      f"continues a run to a larger steps value (evaluate a checkpoint with coevolve eval "
                      f"{resume} --checkpoint N)", 2)
            out_dir = resume
        else:
            if recipe is None:
                _fail("name a recipe (coevolve recipes lists them) or pass --resume DIR", 2)
            if out is not None and not out.strip():
                _fail("--out needs a folder name", 2)
            cfg, params, cls = resolve(recipe, preset=preset, config_file=str(config) if config else None, sets=set_)
            out_dir = Path(out) if out else Path("runs") / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
            if not (print_config or help_config):
                check_run_dir(out_dir, overwrite=overwrite)
        if print_config or help_config:
            typer.echo(settings_help(cfg, params) if help_config else cls.config_yaml(cfg, params), nl=False)
            return
        if cfg.trust_remote_code and not trust_remote_code:
            _fail("config key 'trust_remote_code': the model's own code runs only with --trust-remote-code on the "
                  "command line", 2)
        cfg.trust_remote_code = trust_remote_code
        world = processes if processes > 1 else int(os.environ.get("WORLD_SIZE", "1"))
        check_runtime(cfg, world, fsdp_unsupported=cls.fsdp_unsupported)
        if cfg.rollout.engine == "vllm":
            require_vllm()
        cls.check_inputs(cfg, params)  # benchmark files, document sources, question pools
        _check_lora_targets(cfg)
    except (ConfigError, RunDirError, EngineUnavailable) as exc:
        _fail(str(exc), 2)
    except KeyError as exc:  # a recipe's data set name (params.train_split, params.dev_source) that is not a set
        _fail(str(exc).strip("'\""), 2)
    except (FileNotFoundError, TaskDataError, DocumentError) as exc:  # a benchmark file, with what to pass
        _fail(str(exc))
    if processes > 1 and not distributed.launched_distributed():
        _launch_ranks(processes, out_dir)
        return
    single = not distributed.launched_distributed()  # under a launcher, the launcher handles SIGTERM
    try:
        with _sigterm_as_interrupt() if single else nullcontext():
            distributed.init_from_env(distributed.device_for(cfg.device))
            main = distributed.is_main()  # rank 0 alone writes the run directory
            prepare_builtin(cfg.model, progress=main and not quiet)  # a first use of tiny-arith builds it
            with claim_run_dir(out_dir, resume=resume is not None, overwrite=overwrite) if main else nullcontext():
                instance = cls(cfg, params)
                if main:
                    typer.echo(f"run directory: {out_dir}", err=True)
                summary = run_loop(instance, cfg, out_dir, resume=resume is not None, progress=not quiet)
    except (ConfigError, RunDirError) as exc:
        _fail(str(exc), 2)
    except (ModelNotFoundError, TaskDataError, EngineUnavailable, PromptTooLong, NonFiniteWeights, FileNotFoundError,
            distributed.DistributedSetupError, CheckpointDamaged, NothingTrained) as exc:
        resumable = resume is None and (out_dir / "config.yaml").exists() \
            and not isinstance(exc, (NonFiniteWeights, NothingTrained))
        _fail(f"{exc}; the run directory is kept: continue with --resume {out_dir}" if resumable else str(exc))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = f"the completed steps are kept: free space, then coevolve run --resume {out_dir}" \
            if (out_dir / "config.yaml").exists() else "the run had not started"
        _fail(f"no space left on the device while writing {exc.filename or out_dir}; {kept}", 2)
    except KeyboardInterrupt as exc:
        code = 143 if isinstance(exc, _Terminated) else 130
        if not (out_dir / "config.yaml").exists():
            _fail("interrupted before the run started", code)
        _fail(f"interrupted; continue with: coevolve run --resume {out_dir}", code)
    if not distributed.is_main():
        return
    typer.echo(f"done: {summary['steps']} steps in {summary['wall_s']:.0f} s  "
               f"{accuracy_line(summary.get('final_eval') or {})}")


def _trained_by(store, step: int, recipe: str, roles: tuple[str, ...]) -> str | None:
    """What wrote checkpoint ``step`` where it is not ``recipe``: the recipe it records, or the roles it holds where
    it records none (written before checkpoints recorded it); None where they agree or nothing is readable."""
    import json

    if not step:
        return None
    try:
        written = json.loads((store.checkpoints_dir / f"step_{step:06d}" / "state.json").read_bytes())
        name = written["recipe"].get("recipe_name")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged checkpoint: the resume sets it aside and says so
    if isinstance(name, str):
        return None if name == recipe else f"recipe {name}"
    held = {role for role in store.checkpoint_roles(step) if not role.endswith("_reference")}
    return f"a recipe with the roles {', '.join(sorted(held))}" if held and held != set(roles) else None


def _check_lora_targets(cfg) -> None:
    """ConfigError unless peft finds ``train.lora.target_modules`` in the run's model, checked on a copy built on the
    meta device from the model's config (no weights, nothing loaded): the built-in models are Llamas, whose module
    names do not depend on their sizes; a local folder has its config.json; a hub id is checked when it loads."""
    if cfg.train.lora is None:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from coevolve.config import ConfigError
    from coevolve.models import BUILTIN_MODELS
    from coevolve.rl.trainer import wrap_lora

    if cfg.model in BUILTIN_MODELS:
        architecture = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    elif (Path(cfg.model) / "config.json").is_file():
        try:
            architecture = AutoConfig.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
        except (OSError, ValueError):
            return  # the model's own load says what is wrong with it
    else:
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture, trust_remote_code=cfg.trust_remote_code)
    try:
        wrap_lora(model, cfg.train.lora.model_dump())
    except ValueError as exc:  # peft: a target module the model does not have
        raise ConfigError(f"config key 'train.lora.target_modules': {str(exc).splitlines()[0]}") from None


def _launch_ranks(processes: int, out_dir: Path) -> None:
    """Run this command on ``processes`` ranks with torchrun (same arguments, the run directory fixed); if any rank
    fails, torchrun stops the others and this says so in one line."""
    import subprocess

    args = sys.argv[1:]
    cut = [i for i, a in enumerate(args) if a == "--processes" or a.startswith("--processes=")]
    for i in reversed(cut):
        del args[i:i + (1 if "=" in args[i] else 2)]
    if "--out" not in args and "--resume" not in args:
        args += ["--out", str(out_dir)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "--max-restarts=0", "-m", "coevolve", *args]
    done = subprocess.run(command)
    if done.returncode != 0:
        _fail(f"a rank failed (exit code {done.returncode}) and the run stopped on all {processes} processes; "
              f"continue with: coevolve run --resume {out_dir} --processes {processes}", done.returncode)


@app.command()
def sft(
    recipe: str = typer.Argument(..., help="recipe whose generator output format (or, with --set warmup=tools, whose "
                                 "solver's tool calls) to teach (see `coevolve recipes`)"),
    set_: list[str] = typer.Option([], "--set", help="override a warm-up key: --set steps=60 (repeatable)"),
    out: str | None = typer.Option(None, "--out", help="output folder, absent or empty (default "
                                      "runs/sft-<recipe>-<time>)"),
    quiet: bool = typer.Option(False, "--quiet", help="no per-step loss lines"),
) -> None:
    """Format warm-up: fine-tune a generator on GSM8K-train problems written in the recipe's output format; start a
    run's generator from it with --set params.generator_init=OUT. With --set warmup=tools: a solver on arithmetic
    problems answered with one python call (docs/tools.md); start a run from it with --set model=OUT/model."""
    from coevolve.config import ConfigError, parse_set
    from coevolve.data.benchmarks import BenchmarkDataNotFound
    from coevolve.models import ModelNotFoundError
    from coevolve.sft import resolve_sft, run_sft

    if out is not None and not out.strip():
        _fail("--out needs a folder name", 2)
    out_dir = Path(out) if out else Path("runs") / f"sft-{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        _fail(f"--out {out_dir} is not an empty folder; the warm-up writes into an empty or absent one", 2)
    try:
        summary = run_sft(resolve_sft(recipe, parse_set(set_)), out_dir, progress=not quiet)
    except ConfigError as exc:
        _fail(str(exc), 2)
    except KeyError as exc:
        _fail(str(exc).strip("'\""), 2)
    except (ModelNotFoundError, BenchmarkDataNotFound) as exc:
        _fail(str(exc))
    use = f"model={out_dir / 'model'}" if summary["warmup"] == "tools" else f"params.generator_init={out_dir}"
    typer.echo(f"done: loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f} in {summary['wall_s']:.0f} s; "
               f"use --set {use}")


@app.command("eval")
def eval_(
    target: str = typer.Argument(..., help="model name, local model folder, or run directory"),
    sets: str = typer.Option(None, "--sets", "--task", help="comma-separated evaluation sets (default: the run's)"),
    preset: str = typer.Option("greedy", "--preset", help="sampling defaults: greedy or a paper's protocol "
                               "(prism, dynamic_rl, opensir, pasodoble, infuser, ttrl, r_zero)"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="seeded subset of this many questions per set"),
    n: int | None = typer.Option(None, "--n", min=1, help="samples per question (avg@n, pass@k)"),
    k: int | None = typer.Option(None, "--k", min=1, help="k for pass@k (default n)"),
    temperature: float | None = typer.Option(None, "--temperature", help="0 = greedy"),
    top_p: float | None = typer.Option(None, "--top-p"),
    top_k: int | None = typer.Option(None, "--top-k"),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens"),
    checkpoint: int | None = typer.Option(None, "--checkpoint", "--step", help="run dir: which step (default "
                                             "latest)"),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="folder with the benchmark files"),
    seed: int = typer.Option(0, "--seed"),
    out: Path | None = typer.Option(None, "--out", help="where to write per-question results"),
    engine_name: str = typer.Option("hf", "--engine", help="sampler: hf (transformers) or vllm (in-process vLLM)"),
    tools: str | None = typer.Option(None, "--tools", help="python: answer in tool-using episodes (docs/tools.md); "
                                     "none: single turns (default: a run directory's rollout.tools, else none)"),
    max_tool_calls: int | None = typer.Option(None, "--max-tool-calls", min=0, help="tool calls per episode "
                                              "(default: the run's rollout.max_tool_calls, else 4)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="let the model folder's own Python "
                                           "code run (a run directory's saved config does not)"),
) -> None:
    """Evaluate a model or a run's checkpoint on evaluation sets (options override the preset)."""
    from pydantic import ValidationError

    from coevolve.config import ConfigError, SamplingConfig, SamplingOverride
    from coevolve.data.benchmarks import BenchmarkDataNotFound
    from coevolve.evaluation.harness import EVAL_PRESETS, evaluate, out_dir_problem
    from coevolve.execution import SandboxUnavailable
    from coevolve.export import exported_eval_sets
    from coevolve.models import ModelFilesDamaged, ModelNotFoundError
    from coevolve.recipes import default_eval_sets, resolve_saved
    from coevolve.roles import evaluation_episodes, evaluation_sampler
    from coevolve.rollout.vllm_engine import EngineUnavailable, require_vllm
    from coevolve.run_models import RunCheckpointError, load_run_policy
    from coevolve.store import CheckpointDamaged

    try:  # the same bounds as a run's sampling settings: finite, temperature >= 0, 0 < top_p <= 1, ...
        SamplingOverride(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
    except ValidationError as exc:
        err = exc.errors()[0]
        _fail(f"--{str(err['loc'][0]).replace('_', '-')} {err.get('input')}: {err['msg']}", 2)
    if preset not in EVAL_PRESETS:
        _fail(f"unknown evaluation preset {preset!r} (known: {', '.join(EVAL_PRESETS)})", 2)
    if engine_name not in ("hf", "vllm"):
        _fail(f"unknown engine {engine_name!r} (known: hf, vllm)", 2)
    if tools not in (None, "python", "none"):
        _fail(f"--tools {tools}: unknown tool (known: python, none)", 2)
    results = out or (Path(target) / "eval" if Path(target, "config.yaml").exists() else None)
    problem = out_dir_problem(results) if results is not None else None
    if problem:
        _fail(f"cannot write the results to {results}: {problem}; pass --out DIR", 2)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # what it assumed
    try:
        if engine_name == "vllm":
            require_vllm()
        policy, default_sets, label = load_run_policy(target, checkpoint, trust_remote_code=trust_remote_code)
    except (ConfigError, RunCheckpointError, CheckpointDamaged, ModelFilesDamaged) as exc:
        _fail(str(exc), 2)
    except (ModelNotFoundError, FileNotFoundError, EngineUnavailable) as exc:
        _fail(str(exc))
    saved = resolve_saved(str(Path(target, "config.yaml")))[0].rollout if Path(target, "config.yaml").exists() \
        else SamplingConfig()  # the run's tool settings are the default
    rollout = SamplingConfig(engine=engine_name,
                             tools=saved.tools if tools is None else [] if tools == "none" else [tools],
                             max_tool_calls=saved.max_tool_calls if max_tool_calls is None else max_tool_calls)
    set_names = [s.strip() for s in sets.split(",")] if sets else (
        default_sets or (exported_eval_sets(Path(target)) if Path(target).is_dir() else None)
        or default_eval_sets("program" if target == "tiny-program" else "arith"))
    out_dir = out or (Path(target) / "eval" / label if Path(target, "config.yaml").exists() else None)
    try:
        with evaluation_episodes(evaluation_sampler(policy, rollout, seed=seed), policy, rollout) as engine:
            summaries = evaluate(policy, engine, set_names, preset=preset, n_samples=n, k=k, temperature=temperature,
                                 top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, limit=limit, seed=seed,
                                 data_dir=str(data_dir) if data_dir else None, out_dir=out_dir, progress=True)
    except SandboxUnavailable as exc:
        _fail(f"--tools python: tool calls run in the bubblewrap sandbox, which cannot run here: {exc}", 2)
    except (BenchmarkDataNotFound, KeyError, ValueError, EngineUnavailable) as exc:
        _fail(str(exc).strip("'\""))
    except OSError as exc:  # the results could not be written (a full disk, a folder changed meanwhile)
        _fail(f"cannot write the results to {out_dir}: {exc.strerror or exc}", 2)
    for name, s in summaries.items():
        extras = "  ".join(f"{key} {val:.3f}" for key, val in s.items()
                           if key.startswith(("pass@", "avg@")) and isinstance(val, float))
        calls = f"  tool calls {s['tool_call_rate']:.3f}" if rollout.tools else ""
        typer.echo(f"{name:<14} accuracy: strict {s['accuracy']:.3f}  lenient {s['accuracy_lenient']:.3f}  {extras}  "
                   f"n={s['n_questions']}  {s['seconds']:.1f}s{calls}")
        if s["answer_rules"]:
            typer.echo(f"{'':<14} strict: {s['answer_rules']['strict']}; lenient: {s['answer_rules']['lenient']}")
    if out_dir:
        typer.echo(f"results: {out_dir}")


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="run directory"),
    out: str = typer.Option(..., "--out", help="folder for the model: absent or empty (or an earlier export, with "
                            "--overwrite)"),
    step: str = typer.Option("latest", "--step", help="checkpoint: a step number, latest, or best (by --metric)"),
    metric: str | None = typer.Option(None, "--metric", help="--step best ranks checkpoints by this metrics.jsonl "
                                         "name (default eval/<first eval set>/accuracy, strict)"),
    role: str | None = typer.Option(None, "--role", help="which model of the run (default the solver; "
                                       "generator, questioner, proposer or policy by the recipe's names)"),
    dtype: str = typer.Option("fp32", "--dtype", help="weights as fp32 (as trained) or bf16"),
    merge: bool = typer.Option(True, "--merge/--adapter", help="LoRA runs: merge the adapters into the weights "
                               "(default) or write a PEFT adapter folder that names its base model"),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="split the weights into files of this size"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier export in --out (removes only the "
                                   "files it wrote)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="let the model folder's own Python "
                                           "code run (a run directory's saved config does not)"),
) -> None:
    """Write one trained model of a run as a standard Hugging Face folder (config, tokenizer, safetensors, card)."""
    from coevolve.config import ConfigError
    from coevolve.export import ExportError, ExportSettings, export_run
    from coevolve.models import ModelNotFoundError
    from coevolve.run_models import RunCheckpointError
    from coevolve.store import CheckpointDamaged

    if not out.strip():
        _fail("--out needs a folder name", 2)
    if step not in ("latest", "best") and not (step.isascii() and step.isdigit()):
        _fail(f"--step {step}: give a step number, latest or best", 2)
    settings = ExportSettings(step=int(step) if step.isdigit() else step, role=role, metric=metric, dtype=dtype,
                              adapter=not merge, max_shard_size=max_shard_size, overwrite=overwrite)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its per-file bars for a few files would bury the one result line
    try:
        manifest = export_run(run_dir, out, settings, trust_remote_code=trust_remote_code)
    except (ExportError, RunCheckpointError, CheckpointDamaged, ConfigError) as exc:
        _fail(str(exc), 2)
    except ModelNotFoundError as exc:
        _fail(str(exc))
    typer.echo(f"exported the {manifest['role']} of step {manifest['step']} ({manifest['kind']}, {manifest['dtype']}) "
               f"to {out}")


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="run directory"),
    out: Path | None = typer.Option(None, "--out", help="HTML file (default RUN/report/report.html)"),
    no_embed: bool = typer.Option(False, "--no-embed", help="skip embedding-based diversity (no encoder)"),
) -> None:
    """Write one self-contained HTML report (plots embedded) of a run's training and curriculum."""
    from coevolve.analytics.report import write_report
    from coevolve.embeddings import EncoderUnavailable

    if not (run_dir / "metrics.jsonl").exists():
        _fail(f"{run_dir} is not a run directory (no metrics.jsonl)")
    try:
        typer.echo(write_report(run_dir, out, embed=not no_embed))
    except (EncoderUnavailable, FileNotFoundError) as exc:
        _fail(str(exc))


@app.command()
def compare(
    run_dirs: list[Path] = typer.Argument(..., help="two or more run directories"),
    out: Path = typer.Option(Path("compare"), "--out", help="folder for compare.html/.csv/.json"),
    embed: bool = typer.Option(False, "--embed", help="shared embedding cluster space for coverage numbers"),
) -> None:
    """Print and write a side-by-side table of runs, with their curves overlaid."""
    from rich.console import Console

    from coevolve.analytics.compare import compare_runs, rich_table
    from coevolve.embeddings import EncoderUnavailable

    missing = [str(d) for d in run_dirs if not (d / "metrics.jsonl").exists()]
    if missing:
        _fail(f"not run directories (no metrics.jsonl): {', '.join(missing)}")
    try:
        rows, html_path = compare_runs(run_dirs, out, embed=embed)
    except (EncoderUnavailable, FileNotFoundError) as exc:
        _fail(str(exc))
    Console().print(rich_table(rows))
    typer.echo(html_path)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
