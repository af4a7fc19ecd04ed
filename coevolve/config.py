"""The run config: typed and validated; layered from recipe defaults, a preset, a YAML file and --set.

Every key is checked: an unknown key, a wrong type (true or 2.5 for a count) or a non-finite number raises
``ConfigError`` with one line that names the key, before anything is written. Config files and ``--set`` values are
capped in size (YAML aliases expanded), so an alias bomb is one short error instead of a hang.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re
import reprlib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator
from pydantic.fields import FieldInfo

# Tokens per forward/backward pass on a GPU when train.micro_batch_tokens is unset (H200, 1.5B: 27% of the bf16 peak
# against 22% for passes of 8 x 640-token sequences; 0.5B: 14% against 8%; bench/README.md).
GPU_MICRO_BATCH_TOKENS = 16384
DEFAULT_TIS_CAP = 2.0  # rho_max of TIS when rollouts are not sampled from pi itself (INFUSER's 2.0; verl's value)
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf)", re.IGNORECASE)
MAX_CONFIG_BYTES = 1 << 20  # a resolved config.yaml is about 2 KB
MAX_CONFIG_VALUES = 100_000  # scalars, lists and mappings, with YAML aliases expanded
_SHORT = reprlib.Repr()  # the offending value in an error line, cut short
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 80, 80


# Settings the trainer's UpdateSettings shares with the config (coevolve.rl.trainer types its fields with these)
LrSchedule = Literal["constant", "cosine"]
OptimizerReset = Literal["never", "phase"]
KlReference = Literal["initial", "phase_start"]
LossAgg = Literal["seq_mean", "token_sum_norm", "token_mean"]
Precision = Literal["auto", "fp32", "bf16"]  # auto: bf16 on a CUDA device that has it, fp32 otherwise


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the offending key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class VLLMConfig(Strict):
    """The in-process vLLM engine (``rollout.engine: vllm``), one per policy that samples."""

    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="CUDA: share of GPU memory per engine")
    kv_cache_gib: float = Field(0.5, gt=0, description="CPU: KV-cache size per engine, GiB")
    max_model_len: StrictInt | None = Field(None, gt=0, description="context in tokens; default min(model's, 4096)")
    sleep: bool = Field(True, description="CUDA: free the engine's weights and KV cache while the trainer runs")
    tensor_parallel_size: StrictInt = Field(1, ge=1, description="ranks (one GPU each) that run one engine "
                                            "together; it must divide the number of processes")


class SamplingOverride(Strict):
    """Sampling settings of one use of a model that differ from its training rollouts' (``rollout.*``); an unset
    field keeps the ``rollout.*`` value."""

    temperature: float | None = Field(None, ge=0, description="sampling temperature (0: greedy); unset: "
                                      "rollout.temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling mass (1: off); unset: rollout.top_p")
    top_k: StrictInt | None = Field(None, ge=0, description="sample among the k likeliest tokens (0: off); unset: "
                              "rollout.top_k")
    max_new_tokens: StrictInt | None = Field(None, gt=0, description="new tokens per sample; unset: "
                                       "rollout.max_new_tokens")


class SamplingConfig(Strict):
    """Rollout sampling for training (evaluation has its own settings)."""

    engine: Literal["hf", "vllm"] = Field("hf", description="hf: our transformers token loop; vllm: in-process vLLM")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of training rollouts (0: greedy); the "
                               "trainer takes log-probs under logits / temperature (verl's and TRL's default 1.0)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: sample from the likeliest tokens holding "
                         "this probability mass (1: off)")
    top_k: StrictInt = Field(0, ge=0, description="sample among the k likeliest tokens (0: off)")
    max_new_tokens: StrictInt = Field(64, gt=0, description="new tokens per training rollout (each recipe's "
                                      "presets cite their paper's or code's length; 64: a CPU budget)")
    batch_size: int | Literal["auto"] = Field(
        "auto", description="hf engine: prompts per forward pass while sampling; auto: on CUDA as many as the free "
        "device memory holds for the call's prompts and token budget (halved and retried on an out-of-memory error), "
        "64 elsewhere")
    dtype: Precision = Field(
        "auto", description="hf engine: bf16 samples from a bf16 copy of the weights (refreshed after each update, "
        "LoRA merged) with the static decoder; fp32 from the trainer's own weights; auto: bf16 on a CUDA device "
        "that has it, fp32 otherwise")
    cuda_graphs: bool = Field(True, description="hf engine, bf16 copy on CUDA: replay each decoding step as a CUDA "
                              "graph")
    sync_every: StrictInt = Field(16, gt=0, description="hf engine, bf16 copy: tokens between the host's checks for "
                            "finished rows and stop strings")
    keep_sampler: bool = Field(True, description="hf engine: keep the bf16 copy and the decoding buffers between "
                               "calls (false: free them after each call)")
    vllm: VLLMConfig = Field(VLLMConfig(), description="the in-process vLLM engine (rollout.engine: vllm)")
    tools: list[Literal["python"]] = Field(
        default_factory=list, description="tools a training rollout may call, which makes each sample an episode "
        "(docs/tools.md): python: the model writes ```python ... ``` then ```output, the code runs in the bubblewrap "
        "sandbox and its printed output is appended; [] (default): single-turn samples")
    max_tool_calls: int = Field(4, ge=0, description="tool calls per episode (Agent0's max_turns 4); the episode "
                                "ends when the model asks for one more; only with rollout.tools")
    scoring: SamplingOverride = Field(SamplingOverride(), description="samples that score or label questions instead "
                                      "of training (r_zero / prism: the solver's votes for p(q) and for the pool's "
                                      "labels); unset fields: the training rollouts' values above")

    @field_validator("batch_size", mode="before")
    @classmethod
    def _prompts_or_auto(cls, value: Any) -> Any:
        """A positive whole number or auto (true is not a batch size; a union's own error would name its branches)."""
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError("a number of prompts above 0 or auto")
        return value


class LoraSettings(Strict):
    """LoRA adapters (peft's ``LoraConfig``), trained instead of the whole model."""

    r: StrictInt = Field(8, gt=0, description="adapter rank (peft's r)")
    lora_alpha: StrictInt = Field(16, gt=0, description="scaling: the adapter's update is multiplied by lora_alpha / r "
                            "(peft's lora_alpha)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout probability on the adapters' input (peft's "
                                "lora_dropout)")
    target_modules: list[str] | str = Field("all-linear", description="modules that get adapters: their names, or "
                                            "all-linear (every linear layer but the output head; peft)")


class TrainConfig(Strict):
    """The policy-gradient update (shared by every role unless a recipe overrides it per role)."""

    lr: float = Field(1e-5, gt=0, description="AdamW's (peak) learning rate; each recipe's presets cite their "
                      "paper's or code's value")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay coefficient (verl's actor "
                                "default 0.01; 0: none)")
    grad_clip: float = Field(1.0, ge=0, description="largest global L2 norm of the gradient per optimizer step "
                             "(verl's and TRL's 1.0; 0: no clipping)")
    mini_batch_size: StrictInt = Field(0, ge=0, description="sequences per optimizer step; 0 = whole batch")
    micro_batch_size: StrictInt = Field(8, gt=0, description="sequences per forward/backward pass when "
                                        "micro_batch_tokens is unset (memory only: the accumulated gradient is the "
                                        "same)")
    micro_batch_tokens: StrictInt | None = Field(None, gt=0, description="tokens per forward/backward pass instead of "
                                           "micro_batch_size sequences (a shared prompt counts once when packed); "
                                           "unset: 16,384 on a GPU for models whose log-prob head runs in chunks "
                                           "(Llama, Mistral, Qwen2, Qwen3), lowered at each update to what the "
                                           "free GPU memory holds; micro_batch_size sequences otherwise")
    epochs: StrictInt = Field(1, gt=0, description="passes over each rollout batch (PPO epochs, verl's ppo_epochs)")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip, lower side: the ratio is clipped at 1 - clip_low "
                            "(PPO's epsilon 0.2)")
    clip_high: float = Field(0.2, ge=0, description="PPO ratio clip, upper side: 1 + clip_high (DAPO's clip-higher "
                             "when above clip_low, 0.28 in DAPO)")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip PPO: the loss of a token with A < 0 is capped "
                                    "at -c * A (verl's clip_ratio_c, 3.0 in R-Zero's and Prism's code); unset: off")
    lr_schedule: LrSchedule = Field(
        "constant", description="cosine: within each phase of a recipe with phases (r_zero, prism), linear warm-up "
        "over lr_warmup_ratio of the phase's steps, then cosine decay from lr towards lr_min_ratio * lr (verl's "
        "schedule over a job of the phase's steps)")
    lr_warmup_ratio: float = Field(0.0, ge=0, lt=1, description="lr_schedule cosine: share of a phase's steps that "
                                   "warm up linearly from 0")
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description="lr_schedule cosine: the lr at a phase's last step, as "
                                "a share of lr")
    optimizer_reset: OptimizerReset = Field(
        "never", description="phase: a fresh AdamW (moments and step counts cleared) at the start of each of a role's "
        "phases (recipes with phases), as when each phase is a new training job; never: AdamW state carries over")
    tis_cap: float | None = Field(None, gt=0, description="truncated importance sampling cap; default 2.0 when "
                                  "rollouts are not sampled from the trained weights (vllm, a bf16 sampler copy, "
                                  "constrained decoding), off otherwise")
    kl_beta: float = Field(0.0, ge=0, description="coefficient of the per-token k3 estimate of KL(pi || pi_ref) "
                           "added to the loss (GRPO's beta, verl's kl_loss_coef); 0: no KL term and no reference "
                           "model")
    kl_clamp: float | None = Field(None, gt=0, description="each token's k3 KL estimate clamped to [-kl_clamp, "
                                   "kl_clamp] before it enters the loss (verl's low_var_kl clamps to 10; TTRL's "
                                   "code uses it); unset: no clamp")
    kl_reference: KlReference = Field(
        "initial", description="the KL term's reference: initial, the weights the role started the run with; "
        "phase_start, its weights at the start of each of its phases (recipes with phases), as when each phase is a "
        "new training job whose reference is the job's starting model (R-Zero's and Prism's code)")
    entropy_coef: float = Field(0.0, description="entropy bonus: loss = pg_loss - entropy_coef * H, H the entropy "
                                "of the policy's whole next-token distribution (at the sampling temperature) at each "
                                "completion token, aggregated like the loss (loss_agg); verl's entropy_coeff (0.001 "
                                "on AZR's paper branch); logged as <role>/entropy; 0: off and not computed")
    loss_agg: LossAgg = Field(
        "seq_mean", description="how token losses make the loss: seq_mean, mean over each sequence's tokens, then "
        "over sequences (GRPO); token_sum_norm, each sequence's sum / norm_constant, mean over sequences (Dr.GRPO); "
        "token_mean, mean over every token of the mini-batch (DAPO; verl's default token-mean)")
    norm_constant: StrictInt | None = Field(None, gt=0, description="Dr.GRPO's C; default max_new_tokens")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters instead of every weight (peft); "
                                      "unset: full fine-tuning")
    dtype: Precision = Field(
        "auto", description="bf16: mixed precision (bf16 autocast for forward and backward, fp32 weights and AdamW "
        "state); auto: bf16 on a CUDA device that has it, fp32 otherwise")
    gradient_checkpointing: bool | None = Field(None, description="recompute activations in the backward pass: "
                                                "true, every decoder layer; false, none; unset, off on CPU and on "
                                                "CUDA only as many layers as the free memory needs at each update "
                                                "(none when every layer's activations fit a pass)")
    compile: bool = Field(False, description="torch.compile each decoder layer of the trained model (fuses its "
                          "elementwise kernels; the first update compiles)")
    offload_idle_role: bool | None = Field(None, description="keep only the role that samples or trains on the GPU; "
                                           "the other roles' weights and AdamW state wait in host memory; unset: off "
                                           "on CPU, on CUDA on when the memory plan needs it (a two-role run whose "
                                           "training state does not fit the free memory)")
    optimizer: Literal["adamw", "adamw_8bit"] | None = Field(
        None, description="adamw: torch's AdamW (fp32 moments, 8 bytes per trained parameter); adamw_8bit: torchao's "
        "AdamW8bit (block-wise 8-bit moments, about 2 bytes per parameter; pip install 'coevolve[optim8bit]'); unset: "
        "adamw, or on CUDA adamw_8bit when the memory plan needs it")
    lora_if_needed: bool = Field(False, description="on CUDA, let the memory plan train LoRA adapters (train.lora's "
                                 "defaults) when full fine-tuning does not fit the free memory even with "
                                 "offload_idle_role and adamw_8bit; LoRA changes what is trained, so the plan never "
                                 "chooses it otherwise")
    fsdp: bool = Field(False, description="shard each role's weights, gradients and AdamW state over the processes "
                       "(torch FSDP2), for a model whose training state does not fit one device; needs several "
                       "processes")


class RoleSettings(Strict):
    """One role's own update settings (``roles.<role>``, e.g. ``roles.questioner.epochs``); an unset field keeps the
    run's ``train`` value. The roles are the recipe's (``coevolve recipes``; R-Zero's questioner and solver)."""

    lr: float | None = Field(None, gt=0, description="the role's AdamW (peak) learning rate")
    mini_batch_size: StrictInt | None = Field(None, ge=0, description="sequences per AdamW step (0: the whole batch)")
    epochs: StrictInt | None = Field(None, gt=0, description="passes over the role's rollout batch")
    lr_schedule: LrSchedule | None = Field(None, description="the role's lr over each of its phases")
    optimizer_reset: OptimizerReset | None = Field(None, description="a fresh AdamW at each of the role's phases")


class RunConfig(Strict):
    """Everything a run needs; written resolved to ``config.yaml`` in the run directory."""

    recipe: str = Field(description="the method that trains (coevolve recipes lists them)")
    model: str = Field("tiny-arith", description="tiny-arith, tiny-program, tiny-calc, smollm2-135m, a local model "
                       "folder or a hub id already in the local cache (runs are offline)")
    task: str = Field("arith", description="the world questions come from and answers are graded in: arith, math, "
                      "mcq; program or python (azr)")
    seed: StrictInt = Field(0, description="seed of every random draw of the run (sampling, data order, adapters' "
                            "start)")
    steps: StrictInt = Field(50, ge=0, description="loop steps; one step is one iteration of the recipe's algorithm "
                             "(its docstring says what it holds)")
    data_dir: str | None = Field(None, description="folder with the benchmark and training files; unset: "
                                 "$COEVOLVE_DATA_DIR, else ../shared/data beside the current folder or the "
                                 "repository")
    trust_remote_code: bool = Field(False, description="let a model folder's own Python code run (also needs "
                                    "--trust-remote-code on the command line)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available (cuda:<local rank> "
                                                   "with several processes), else CPU")
    rollout: SamplingConfig = Field(SamplingConfig(), description="sampling of training rollouts")
    train: TrainConfig = Field(TrainConfig(), description="the policy-gradient update of every role (roles.<role> "
                               "overrides some of it per role)")
    roles: dict[str, RoleSettings] = Field({}, description="per-role update settings over train.* (roles.<role>.lr, "
                                           "mini_batch_size, epochs, lr_schedule, optimizer_reset)")
    eval_every: StrictInt = Field(10, ge=0, description="evaluate every N steps (0 = only at start and end)")
    eval_sets: list[str] | None = Field(None, description="default: the task's sets (arith: levels 1-6)")
    eval_limit: StrictInt | None = Field(200, gt=0, description="questions per evaluation set")
    eval_max_new_tokens: StrictInt = Field(96, gt=0, description="new tokens per evaluation answer (default 96: "
                                           "arith's longest level-6 trace is 82 characters); an eval_preset that "
                                           "names a paper's protocol sets its own unless this is set beside or after "
                                           "it")
    eval_preset: str = Field("greedy", description="sampling of the in-training evaluation: a `coevolve eval` "
                             "preset (greedy, the project's default; or a paper's protocol such as ttrl: avg@16 at "
                             "temperature 0.6, n times the cost, and 3,072 new tokens: a protocol brings its "
                             "budget unless eval_max_new_tokens is set in the same place or later)")
    frozen_generator: bool = Field(False, description="two-role recipes: never update the generator (baseline)")
    checkpoint_every: StrictInt = Field(1, gt=0, description="steps between checkpoints (the last step always "
                                  "saves one)")
    keep_checkpoints: StrictInt = Field(2, gt=0, description="newest checkpoints kept; older ones are deleted")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(["tensorboard"], description="where the run also "
                                                             "reports its metrics (wandb: pip install "
                                                             "'coevolve[wandb]')")
    params: dict[str, Any] = Field({}, description="the recipe's own parameters (params.*; coevolve run RECIPE "
                                   "--help-config lists them)")

    @field_validator("eval_sets")
    @classmethod
    def _known_sets(cls, sets: list[str] | None) -> list[str] | None:
        from coevolve.data.benchmarks import BENCHMARKS

        unknown = [name for name in sets or [] if name not in BENCHMARKS]
        if unknown:
            raise ValueError(f"unknown evaluation set {unknown[0]!r} (known: {', '.join(BENCHMARKS)})")
        return sets


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (mappings merge, anything else replaces)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """Turn ``["train.lr=1e-4", "eval_sets=[arith_l1]"]`` into a nested dict; values are YAML scalars."""
    nested: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        except RecursionError:
            raise ConfigError(f"--set {key}: value is nested too deeply") from None
        if _count_values(value) > MAX_CONFIG_VALUES:
            raise ConfigError(f"--set {key}: value expands to more than {MAX_CONFIG_VALUES} values (YAML aliases?)")
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        node[parts[-1]] = value
    return nested


def _count_values(data: Any) -> float:
    """How many values ``data`` holds with YAML aliases expanded (each shared node is counted once per use but walked
    once, so a billion-laughs document is counted in linear time); infinite for a node that contains itself."""
    sizes: dict[int, float] = {}

    def count(node: Any) -> float:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = math.inf  # until its children are counted: a recursive alias expands without end
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        sizes[id(node)] = 1 + sum(count(child) for child in children)
        return sizes[id(node)]

    return count(data)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file as a mapping (one-line error if unreadable, too large, or not a mapping)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a folder, not a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    if _count_values(data) > MAX_CONFIG_VALUES:
        raise ConfigError(f"config file {path} expands to more than {MAX_CONFIG_VALUES} values (YAML aliases?)")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def _first_error(exc: ValidationError, prefix: str = "", renamed: Mapping[str, str] | None = None) -> str:
    """The first validation error as one line naming the key; ``renamed``: keys that moved, with where to."""
    err = exc.errors()[0]
    key = prefix + ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        moved = (renamed or {}).get(key.removeprefix(prefix))
        return f"config key '{key}' is now {moved}" if moved else f"unknown config key '{key}'"
    return f"config key '{key}': {err['msg'].removeprefix('Value error, ')} (got {_SHORT.repr(err.get('input'))})"


ParamsModel = TypeVar("ParamsModel", bound=BaseModel)


def validate(raw: Mapping[str, Any], params_model: type[ParamsModel],
             renamed: Mapping[str, str] | None = None) -> tuple[RunConfig, ParamsModel]:
    """Validate a merged config and its recipe ``params`` section; raise ConfigError on the first problem (a params
    key in ``renamed`` is named with where it went)."""
    try:
        config = RunConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from None
    try:
        params = params_model.model_validate(config.params)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc, "params.", renamed)) from None
    config.params = params.model_dump(mode="json")
    return config, params


def check_runtime(config: RunConfig, processes: int = 1, fsdp_unsupported: str | None = None) -> None:
    """Settings this machine or launch cannot honour; ``ConfigError`` names the key (checked before anything runs).
    ``fsdp_unsupported``: why the run's recipe cannot shard (its ``fsdp_unsupported``), None where it can."""
    import torch

    from coevolve.distributed import device_for

    if "wandb" in config.report_to and importlib.util.find_spec("wandb") is None:
        raise ConfigError("config key 'report_to': wandb needs the extra: pip install 'coevolve[wandb]'")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config key 'device': cuda requested but no CUDA device is available")
    on_cuda = device_for(config.device).type == "cuda"
    for key, dtype in (("train.dtype", config.train.dtype), ("rollout.dtype", config.rollout.dtype)):
        if dtype == "bf16" and on_cuda and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"config key '{key}': bf16 is not supported by this GPU; use fp32")
    tensor_parallel = config.rollout.vllm.tensor_parallel_size
    if config.rollout.engine == "vllm" and processes % tensor_parallel:
        raise ConfigError(f"config key 'rollout.vllm.tensor_parallel_size': an engine over {tensor_parallel} ranks "
                          f"needs a multiple of {tensor_parallel} processes, not {processes} (--processes, torchrun)")
    if config.rollout.tools:
        from coevolve.execution import sandbox_problem

        problem = sandbox_problem()
        if problem is not None:
            raise ConfigError(f"config key 'rollout.tools': tool calls run in the bubblewrap sandbox, which cannot "
                              f"run here: {problem}")
    if config.train.optimizer == "adamw_8bit" and importlib.util.find_spec("torchao") is None:
        raise ConfigError("config key 'train.optimizer': adamw_8bit needs torchao: pip install 'coevolve[optim8bit]'")
    if config.train.fsdp:
        if processes < 2:
            raise ConfigError("config key 'train.fsdp': sharding needs several processes (--processes N, torchrun "
                              "or accelerate launch); a sharded run resumes on one process with "
                              "--set train.fsdp=false")
        for on, why in ((config.train.lora is not None, "train.lora"),
                        (config.train.offload_idle_role, "train.offload_idle_role"),
                        (config.train.optimizer == "adamw_8bit", "train.optimizer=adamw_8bit"),
                        (config.train.compile, "train.compile"),
                        (fsdp_unsupported is not None, fsdp_unsupported)):
            if on:
                raise ConfigError(f"config key 'train.fsdp': not supported together with {why}")


def role_train(config: RunConfig, role: RoleSettings | None) -> dict[str, Any]:
    """The ``roles.<role>`` settings as a role runs them: its own value where set, else ``train.*``'s."""
    own = role.model_dump(exclude_none=True) if role is not None else {}
    return {key: own.get(key, getattr(config.train, key)) for key in RoleSettings.model_fields}


def to_yaml(config: RunConfig, roles: Mapping[str, RoleSettings | None] | None = None) -> str:
    """The resolved config as YAML (what ``config.yaml`` holds and ``--config`` reads back). ``roles``: each of the
    recipe's roles with its own settings (the recipe's ``role_settings``), written after the config as comments
    that say what each role runs, since ``roles.<role>.*`` overrides ``train.*``."""
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    if not roles:
        return text
    runs = {name: role_train(config, role) for name, role in roles.items()}
    lines = ["# What each role runs: train.* above, with its roles.<role>.* (and its recipe's choices) over these:"]
    lines += [f"#   {name}: " + ", ".join(f"{key} {value}" for key, value in run.items()) for name, run in runs.items()]
    unused = [f"train.{key} ({value})" for key, value in config.train.model_dump(include=set(RoleSettings.model_fields))
              .items() if all(run[key] != value for run in runs.values())]
    if unused:
        lines.append(f"#   no role runs {', '.join(unused)}")
    return text + "\n".join(lines) + "\n"


def setting_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every setting of ``model`` as (dotted key, pydantic field), sections included and walked into; a mapping of
    sections (``roles``) is walked as ``roles.<name>``."""
    out: list[tuple[str, FieldInfo]] = []
    for name, field in model.model_fields.items():
        key = prefix + name
        out.append((key, field))
        for section, keyed in _sections(field.annotation):
            out += setting_fields(section, f"{key}.<name>." if keyed else f"{key}.")
    return out


def _sections(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models a field's type holds: (model, True) for a ``dict[str, Model]``, (model, False) for the
    model itself (also as ``Model | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict:
        return [(model, True) for model, _ in _sections(args[1])] if len(args) == 2 else []
    return [found for arg in args for found in _sections(arg)]


def settings_help(config: RunConfig, params: BaseModel) -> str:
    """Every setting of a resolved run, core and ``params.*``: its key, its value in this run and its description
    (``coevolve run RECIPE --help-config``)."""
    dumped = {**config.model_dump(mode="json"), "params": params.model_dump(mode="json")}
    lines = []
    for key, field in setting_fields(RunConfig) + setting_fields(type(params), "params."):
        node: Any = dumped
        for part in key.split("."):
            node = node.get(part, _UNSET) if isinstance(node, dict) and part != "<name>" else _UNSET
        section = _sections(field.annotation) and typing.get_origin(field.annotation) is not dict
        if "<name>" in key or (section and isinstance(node, dict)):
            shown = ""  # a section (its settings follow), or a setting of a mapping's entries (roles.<name>.lr)
        elif node is _UNSET:  # inside a section the run leaves unset (train.lora)
            shown = f"  (if its section is set; default {json.dumps(field.default)})"
        else:
            shown = f" = {json.dumps(node)}"
        lines.append(f"{key}{shown}\n    {field.description or '(no description)'}")
    return "\n".join(lines) + "\n"


_UNSET = object()
