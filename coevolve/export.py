"""``coevolve export``: one trained role of a run as a standard Hugging Face folder.

The folder holds ``config.json``, ``generation_config.json`` (the run's rollout sampling), the tokenizer files with
the base model's chat template, ``model.safetensors`` (sharded above ``max_shard_size``) and a ``README.md`` model
card; with ``adapter`` (LoRA runs) a PEFT adapter folder (``adapter_config.json`` naming its base model,
``adapter_model.safetensors``) instead of the merged weights. ``coevolve_export.json`` lists every file the export
wrote, so ``overwrite`` removes exactly those, and records the prompt style coevolve reads the model in. The run
directory stays the source of truth; an export is a view of one checkpoint.

Everything that can be wrong with the input (no run, no or a damaged checkpoint, an unknown step, role or metric, a
non-empty ``--out``) is found before anything is written. The folder is written beside ``--out`` under a temporary
name and moved into place when complete.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coevolve.jsonio import atomic_write_text, dumps
from coevolve.models import EXPORT_MANIFEST, Policy, hf_model_source
from coevolve.records import evaluation_table
from coevolve.run_models import RunCheckpoint, find_checkpoint, load_role
from coevolve.store import RunStore

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

    Raises :class:`ExportError` or :class:`~coevolve.run_models.RunCheckpointError` (bad input),
    :class:`~coevolve.store.CheckpointDamaged`, or :class:`~coevolve.models.ModelNotFoundError` when the base model
    cannot be loaded; none of them leaves anything written."""
    out = Path(out)
    if settings.dtype not in DTYPES:
        raise ExportError(f"--dtype {settings.dtype}: choose one of {', '.join(DTYPES)}")
    checkpoint = find_checkpoint(run, settings.step, settings.role, settings.metric)
    if settings.adapter and checkpoint.config.train.lora is None:
        raise ExportError(f"--adapter exports LoRA adapters, and {run} trained full weights (no train.lora); "
                          f"export it without --adapter")
    replaced = check_out_dir(out, settings.overwrite)
    policy = load_role(checkpoint, trust_remote_code=trust_remote_code)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        _write_model(policy, checkpoint, tmp, settings)
        manifest = _manifest(checkpoint, policy, settings, sorted(os.listdir(tmp)) + ["README.md"])
        atomic_write_text(tmp / "README.md", model_card(checkpoint, manifest))
        atomic_write_text(tmp / EXPORT_MANIFEST, dumps(manifest) + "\n")
        _move_into_place(tmp, out, replaced, manifest["files"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


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
    entries = sorted(os.listdir(out))
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


def _move_into_place(tmp: Path, out: Path, replaced: list[str], files: list[str]) -> None:
    """Make ``out`` hold the export written in ``tmp``: renamed as a whole when ``out`` is absent; otherwise the
    earlier export's files are removed (never following a link) and the new ones moved in, the manifest first."""
    if not out.exists():
        os.replace(tmp, out)
        return
    for name in replaced:
        os.unlink(out / name)
    for name in [EXPORT_MANIFEST] + [f for f in files if f != EXPORT_MANIFEST]:
        os.replace(tmp / name, out / name)


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
        "prompt_style": policy.prompt_style, "kind": "lora_adapter" if settings.adapter else "model",
        "lora_merged": checkpoint.config.train.lora is not None and not settings.adapter,
        "dtype": settings.dtype, "coevolve": coevolve.__version__, "commit": source_commit(),
    }


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


def model_card(checkpoint: RunCheckpoint, manifest: dict) -> str:
    """The README.md of an export: where the model comes from, how it was trained and evaluated, how to load it."""
    config, role = checkpoint.config, checkpoint.role
    before, after = _evaluation(checkpoint)
    adapter = manifest["kind"] == "lora_adapter"
    base = manifest["base_model"]
    lines = ["---", "library_name: " + ("peft" if adapter else "transformers"), "tags:", "- coevolve",
             f"- {config.recipe}", "- reinforcement-learning", "---", "",
             f"# {config.recipe} {role}, step {checkpoint.step}", "",
             f"The {role} of a coevolve `{config.recipe}` run, exported from its checkpoint "
             f"at step {checkpoint.step} of {config.steps}"
             + (" as a LoRA adapter." if adapter else " (LoRA adapters merged)." if manifest["lora_merged"] else "."),
             "", "| | |", "|---|---|", f"| recipe | `{config.recipe}` |", f"| role | `{role}` |",
             f"| base model | `{base}` |", f"| step | {checkpoint.step} of {config.steps} |",
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
        lines += [f"Greedy accuracy (%) of the run's evaluation at step {checkpoint.step} (up to {config.eval_limit} "
                  f"questions per set, {config.eval_max_new_tokens} new tokens); strict: the task's answer format, "
                  f"lenient: the last number or expression.", "",
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
        lines += ["A character-level model trained on the raw arithmetic formats: prompt it with them, e.g. "
                  "`Q:3+4*5=?\\n`, not with a chat template.", ""]
    if adapter:
        lines += ["```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer",
                  "", 'model = AutoPeftModelForCausalLM.from_pretrained("DIR")  # loads the base model it names',
                  'tokenizer = AutoTokenizer.from_pretrained("DIR")', "```", "",
                  f"`adapter_config.json` names the base model as `{adapter_base(checkpoint)}`."]
    else:
        lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  'model = AutoModelForCausalLM.from_pretrained("DIR")',
                  'tokenizer = AutoTokenizer.from_pretrained("DIR")', "```", "",
                  'vLLM: `vllm.LLM(model="DIR")`. Evaluate with coevolve: `coevolve eval DIR --sets ...`.']
    return "\n".join(lines) + "\n"


def adapter_base(checkpoint: RunCheckpoint) -> str:
    """The base model as an adapter folder names it: a folder or hub id transformers can load."""
    return hf_model_source(checkpoint.start_model)


def _lora(config) -> str:
    lora = config.train.lora
    if lora is None:
        return "no (full weights)"
    return f"r {lora.r}, alpha {lora.lora_alpha}, targets {lora.target_modules}"
