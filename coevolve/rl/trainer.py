"""The optimizer step: log-probs of sampled tokens, mini-batches, micro-batch accumulation, AdamW.

A ``PolicyTrainer`` owns one set of weights and its optimizer. One policy in two roles is one
trainer fed samples of both roles; a generator and a solver are two trainers.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch

from coevolve import distributed
from coevolve.config import KlReference, LossAgg, LrSchedule, OptimizerReset, RoleSettings, TrainConfig
from coevolve.memory import ModelShape, adam_state_bytes, free_device_memory, plan_training_pass
from coevolve.padding import left_pad, position_ids_from_mask
from coevolve.rl import logprob_head
from coevolve.rl.compiled_layers import compile_decoder_layers, decoder_layers
from coevolve.rl.losses import policy_loss
from coevolve.rl.residency import Residency

log = logging.getLogger(__name__)


@dataclass
class TrainSample:
    """One sampled completion ready for the policy-gradient update."""

    prompt_ids: list[int]
    completion_ids: list[int]
    rollout_logprobs: list[float]
    advantage: float
    tool_mask: Sequence[bool] = ()  # True at tokens a tool wrote (context only: out of the loss); empty: none
    clip_high: float | None = None  # this sample's upper clip range (ADPO); None: the trainer's ``clip_high``

    def __post_init__(self) -> None:
        if self.tool_mask and len(self.tool_mask) != len(self.completion_ids):
            raise ValueError(f"tool_mask has {len(self.tool_mask)} entries for {len(self.completion_ids)} "
                             "completion tokens")

    @property
    def model_tokens(self) -> int:
        """The completion tokens the model wrote (those the loss sees)."""
        return len(self.completion_ids) - sum(self.tool_mask)


def _clip_high(part: Sequence[TrainSample], default: float) -> float | torch.Tensor:
    """The upper clip range of each sample of ``part`` ([B], where one sets its own), else the trainer's."""
    if all(s.clip_high is None for s in part):
        return default
    return torch.tensor([default if s.clip_high is None else s.clip_high for s in part], dtype=torch.float32)


@dataclass
class UpdateSettings:
    """What one update does; mirrors the ``train`` section of the run config."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole batch
    micro_batch_size: int = 8  # sequences per forward/backward pass
    micro_batch_tokens: int | None = None  # tokens per forward/backward pass instead (see micro_batches)
    fit_memory: bool = False  # CUDA: micro_batch_tokens lowered at each update to what the free memory holds
    epochs: int = 1  # passes over the rollout batch (PPO epochs)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None  # dual-clip PPO's c (verl's clip_ratio_c); None: off
    tis_cap: float | None = None
    kl_beta: float = 0.0
    kl_clamp: float | None = None  # each token's k3 clamped to [-kl_clamp, kl_clamp] (verl's low_var_kl: 10)
    kl_reference: KlReference = "initial"  # phase_start: the KL reference moves to the weights at each phase start
    entropy_coef: float = 0.0  # loss = pg_loss - entropy_coef * entropy (verl's entropy_coeff); 0: not computed
    loss_agg: LossAgg = "seq_mean"  # seq_mean (GRPO) | token_sum_norm (Dr.GRPO) | token_mean (DAPO)
    norm_constant: int | None = None  # Dr.GRPO's C; defaults to max_new_tokens
    temperature: float = 1.0  # sampling temperature: log-probs are taken under logits / temperature
    lora: dict | None = None  # peft LoraConfig kwargs, e.g. {"r": 8, "lora_alpha": 16}
    dtype: Literal["fp32", "bf16"] = "fp32"  # bf16: autocast for forward and backward; fp32 weights and AdamW state
    gradient_checkpointing: bool = False
    selective_checkpointing: bool = False  # with fit_memory: only as many layers as the free memory needs
    compile: bool = False  # torch.compile each decoder layer (coevolve.rl.compiled_layers)
    fsdp: bool = False  # shard weights, gradients and AdamW state over the ranks (coevolve.distributed.shard_model)
    lr_schedule: LrSchedule = "constant"  # over a phase's steps: :func:`phase_lr_factor`
    lr_warmup_ratio: float = 0.0
    lr_min_ratio: float = 0.0
    optimizer_reset: OptimizerReset = "never"  # phase: a fresh AdamW at the start of each phase
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"  # adamw_8bit: torchao's AdamW8bit (:func:`make_optimizer`)


def update_settings(train: TrainConfig, role: RoleSettings | None = None, **resolved: Any) -> UpdateSettings:
    """The run config's ``train`` section as UpdateSettings, with a role's own settings (``roles.<role>``) over it;
    ``resolved``: the values only the run knows (its device, model and sampling temperature)."""
    names = {f.name for f in fields(UpdateSettings)}
    values = {k: v for k, v in train.model_dump().items() if k in names}
    values.update(role.model_dump(exclude_none=True) if role is not None else {})
    values["optimizer"] = train.optimizer or "adamw"  # unset: AdamW unless the run's memory plan decides (roles.py)
    return UpdateSettings(**{**values, **resolved})


def phase_lr_factor(settings: UpdateSettings, index: int, total: int) -> float:
    """The share of the peak ``lr`` at step ``index`` (0-based) of a phase of ``total`` steps: 1 for ``constant``;
    for ``cosine``, a linear warm-up from 0 over the first ``lr_warmup_ratio`` of the steps, then a half cosine from
    1 towards ``lr_min_ratio`` (verl's and EasyR1's cosine schedule over a job of ``total`` steps: the step after the
    last would be at ``lr_min_ratio``)."""
    if settings.lr_schedule == "constant":
        return 1.0
    warmup = int(settings.lr_warmup_ratio * total)
    if index < warmup:
        return index / warmup
    progress = min(max((index - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return settings.lr_min_ratio + (1 - settings.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# The mini-batch order of update u is drawn with seed * UPDATE_SEED_STRIDE + u: a prime stride above any run's
# number of updates, so that no two (seed, update) pairs share an order.
UPDATE_SEED_STRIDE = 1_000_003

# Packing a micro-batch into one row needs an N x N attention mask (N = its tokens); past this the mask's memory
# and the attention over it cost more than padding, so longer micro-batches are padded instead.
PACK_MAX_TOKENS = 4096


def sequence_logprobs(model, samples: Sequence[TrainSample], pad_id: int,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each sample's completion tokens under ``model``: ([B, T], mask [B, T]).

    Row i holds sample i's completion in its last ``len(completion_ids)`` columns (T = the longest completion).
    Each log-prob is the target's logit minus the log-sum-exp of its row (no [B, T, V] log-softmax), and logits
    are computed only where a completion token is predicted (:func:`_logprobs_at`). The micro-batch runs packed in
    one row when the model takes a 4D attention mask (:func:`packed_logprobs`); otherwise left-padded
    (:func:`padded_logprobs`).
    """
    logprobs, mask, _ = completion_logprobs(model, samples, pad_id, temperature, entropy=False)
    return logprobs, mask


def completion_logprobs(model, samples: Sequence[TrainSample], pad_id: int, temperature: float,
                        entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`sequence_logprobs` and, with ``entropy``, the [B, T] entropy of the policy's whole distribution
    (at ``temperature``) at each completion token, differentiable; else None."""
    width = max(len(s.completion_ids) for s in samples)
    device = next(model.parameters()).device
    if packs(model, samples):
        logprobs, entropies = packed_logprobs(model, samples, width, temperature, entropy)
    else:
        logprobs, entropies = padded_logprobs(model, samples, pad_id, width, temperature, entropy)
    lengths = torch.tensor([len(s.completion_ids) for s in samples])
    written = torch.arange(width) >= width - lengths[:, None]
    if any(s.tool_mask for s in samples):  # episodes: tool observations are context, not actions
        written &= ~_right_aligned([[float(t) for t in s.tool_mask] for s in samples], width).bool()
    mask, = _to_device(device, written.to(logprobs.dtype))
    return logprobs, mask, entropies


def _to_device(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host tensors on ``device``. On CUDA they are copied from pinned memory without waiting for the GPU (a copy
    from pageable memory synchronises the stream, which would stall every micro-batch's first kernels)."""
    if device.type != "cuda":
        return [t.to(device) for t in tensors]
    return [t.pin_memory().to(device, non_blocking=True) for t in tensors]


def takes_4d_mask(model) -> bool:
    """Whether the model's attention takes a 4D additive mask as given (sdpa and eager do; flash kernels do not)."""
    return getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")


def packs(model, samples: Sequence[TrainSample]) -> bool:
    """Whether :func:`sequence_logprobs` packs these samples: a model that :func:`takes_4d_mask`, at most
    ``PACK_MAX_TOKENS`` packed tokens, and no sequence longer than a sliding attention window."""
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    packed = sum(len(s.completion_ids) for s in samples) + sum(len(p) for p in {tuple(s.prompt_ids) for s in samples})
    return _packs(model, packed, longest)


def _packs(model, packed_tokens: int, longest: int) -> bool:
    window = getattr(model.config, "sliding_window", None)
    return takes_4d_mask(model) and packed_tokens <= PACK_MAX_TOKENS and not (window and longest > window)


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(-1)
    logprobs = logits.gather(-1, targets[..., None])[..., 0] - lse
    if not entropy:
        return logprobs, None
    return logprobs, lse - (logits.softmax(-1) * logits).sum(-1)  # H = lse - sum_v p_v z_v (verl's formula)


def _logprobs_at(model, inputs: dict[str, torch.Tensor], keep: torch.Tensor, targets: torch.Tensor,
                 temperature: float, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, K] log-probs of ``targets`` [B, K] under the logits at sequence positions ``keep`` [K] of one pass over
    ``inputs``, and with ``entropy`` the [B, K] entropies of those distributions (else None): through the chunked
    head where it applies (:mod:`coevolve.rl.logprob_head`), else from the model's own logits at those positions
    (transformers' ``logits_to_keep``)."""
    split = logprob_head.split_model(model, targets.numel())
    if split is None:
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
        return _token_logprobs(logits, targets, temperature, entropy)
    hidden = split.body(**inputs, use_cache=False).last_hidden_state
    if entropy:
        return logprob_head.head_logprobs_entropy(hidden[:, keep], split.head.weight, targets, temperature)
    return logprob_head.head_logprobs(hidden[:, keep], split.head.weight, targets, temperature), None


def padded_logprobs(model, samples: Sequence[TrainSample], pad_id: int, width: int, temperature: float,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, width] log-probs (and entropies, or None) with prompt + completion left-padded together (completions end
    at the right edge)."""
    device = next(model.parameters()).device
    ids, attention = left_pad([s.prompt_ids + s.completion_ids for s in samples], pad_id)
    keep = torch.arange(ids.shape[1] - width - 1, ids.shape[1] - 1)  # the positions predicting the last width tokens
    ids, attention, keep = _to_device(device, ids, attention, keep)
    inputs = {"input_ids": ids, "attention_mask": attention, "position_ids": position_ids_from_mask(attention)}
    return _logprobs_at(model, inputs, keep, ids[:, -width:], temperature, entropy)


def packed_logprobs(model, samples: Sequence[TrainSample], width: int, temperature: float,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, width] log-probs (and entropies, or None) from one packed row: each distinct prompt once, followed by its
    samples' completions.

    The additive 4D mask lets a prompt token see its prompt causally and a completion token its prompt and its own
    completion causally; positions restart per sequence. Every token so gets the values it gets alone, with no
    padding and a prompt shared by a group computed (and back-propagated through) once.
    """
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    ids: list[int] = []
    positions: list[int] = []
    group_of: list[int] = []  # which prompt each packed token belongs to
    sample_of: list[int] = []  # which sample's completion (-1: a prompt token)
    predictors: list[int] = []  # packed index whose logits predict each completion token, in sample order
    targets: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    for g, (prompt, members) in enumerate(groups.items()):
        ids += prompt
        positions += range(len(prompt))
        group_of += [g] * len(prompt)
        sample_of += [-1] * len(prompt)
        prompt_end = len(ids) - 1
        for i in members:
            completion = samples[i].completion_ids
            n, start = len(completion), len(ids)
            ids += completion
            positions += range(len(prompt), len(prompt) + n)
            group_of += [g] * n
            sample_of += [i] * n
            predictors += [prompt_end, *range(start, start + n - 1)][:n]
            targets += completion
            rows += [i] * n
            cols += range(width - n, width)
    ids_t, positions_t, group_t, sample_t, predictors_t, targets_t, rows_t, cols_t = _to_device(
        device, *(torch.tensor(x, dtype=torch.long)
                  for x in (ids, positions, group_of, sample_of, predictors, targets, rows, cols)))
    visible = (torch.ones(len(ids), len(ids), dtype=torch.bool, device=device).tril_()
               & (group_t[:, None] == group_t[None, :])
               & ((sample_t[None, :] == -1) | (sample_t[:, None] == sample_t[None, :])))
    mask = torch.zeros(len(ids), len(ids), dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    inputs = {"input_ids": ids_t[None], "attention_mask": mask[None, None], "position_ids": positions_t[None]}
    flat, flat_entropy = _logprobs_at(model, inputs, predictors_t, targets_t[None], temperature, entropy)
    out = torch.zeros(len(samples), width, dtype=flat.dtype, device=device)
    if flat_entropy is None:
        return out.index_put((rows_t, cols_t), flat[0]), None
    return out.index_put((rows_t, cols_t), flat[0]), out.index_put((rows_t, cols_t), flat_entropy[0])


def _right_aligned(values: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(values), width)
    for row, v in enumerate(values):
        if v:
            out[row, width - len(v):] = torch.tensor(v, dtype=torch.float32)
    return out


def _micro_batch_order(model, samples: Sequence[TrainSample], indices: Sequence[int]) -> list[int]:
    """The mini-batch's indices in the order they are cut into micro-batches (the accumulated gradient does not
    depend on it): packed, a group's samples together so their prompt is computed once; padded, by length."""
    if takes_4d_mask(model):
        return sorted(indices, key=lambda i: (samples[i].prompt_ids, len(samples[i].completion_ids)))
    return sorted(indices, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].completion_ids))


def micro_batches(model, samples: Sequence[TrainSample], order: Sequence[int],
                  settings: UpdateSettings) -> list[list[int]]:
    """The sample indices ``order`` cut, in that order, into the micro-batches of one forward/backward pass each.

    ``micro_batch_size`` sequences each or, with ``micro_batch_tokens`` set, as many sequences as fit a pass of that
    many tokens (each distinct prompt counted once when the pass packs, rows x the longest sequence when it pads);
    a sequence longer than the budget gets a pass of its own.
    """
    order = list(order)
    budget = settings.micro_batch_tokens
    if not budget:
        return [order[i:i + settings.micro_batch_size] for i in range(0, len(order), settings.micro_batch_size)]
    cuts: list[list[int]] = []
    prompts: set[tuple[int, ...]] = set()
    packed = longest = 0
    for i in order:
        s = samples[i]
        prompt, length = tuple(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids)
        grown = packed + len(s.completion_ids) + (0 if prompt in prompts else len(prompt)), max(longest, length)
        if not cuts or _pass_tokens(model, *grown, len(cuts[-1]) + 1) > budget:
            cuts.append([])
            prompts, grown = set(), (length, length)
        cuts[-1].append(i)
        prompts.add(prompt)
        packed, longest = grown
    return cuts


def _pass_tokens(model, packed_tokens: int, longest: int, rows: int) -> int:
    """Tokens one pass over ``rows`` sequences computes: packed when :func:`_packs`, else padded to the longest."""
    return packed_tokens if _packs(model, packed_tokens, longest) else rows * longest


def wrap_lora(model: torch.nn.Module, lora: Mapping[str, Any]) -> torch.nn.Module:
    """``model`` with LoRA adapters (peft ``LoraConfig`` kwargs, ``train.lora``) as a trainer trains it; a checkpoint
    of the trained role loads into the result."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))


def make_optimizer(params: list[torch.nn.Parameter], settings: UpdateSettings) -> torch.optim.Optimizer:
    """AdamW over ``params`` with ``settings``' lr, betas and weight decay: torch's (fused where every parameter is a
    CPU or CUDA float tensor: one pass over all of them), or with ``optimizer: adamw_8bit`` torchao's AdamW8bit, whose
    moments of every parameter of at least 4,096 values are block-wise 8-bit (:func:`coevolve.memory.adam_state_bytes`)
    and whose step is compiled per parameter shape at its first use (``torch.compile``)."""
    if settings.optimizer == "adamw_8bit":
        from torchao.optim import AdamW8bit  # its import's warnings are silenced (coevolve/__init__.py)

        return AdamW8bit(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay,
                             fused=fused)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group's learning rate to ``lr`` (in place where it is a tensor, as torchao's optimizers keep it)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


class PolicyTrainer:
    """AdamW policy-gradient updates of one model (optionally LoRA), with an optional frozen reference."""

    def __init__(self, model, tokenizer, settings: UpdateSettings, *, seed: int = 0):
        self.configured = self.settings = settings  # settings: this update's (see _fit_passes)
        self.tokenizer = tokenizer
        self.seed = seed
        if settings.lora:
            with torch.random.fork_rng():  # the adapters' random start: the same on every rank and in every run
                torch.manual_seed(seed)
                model = wrap_lora(model, settings.lora)
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if settings.compile:
            compile_decoder_layers(model)
        self.model = model
        self.reference = None
        if settings.kl_beta > 0 and not settings.lora:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if settings.fsdp:
            distributed.shard_model(model)
            if self.reference is not None:
                distributed.shard_model(self.reference)
        self.optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], settings)
        self.updates_done = 0
        self.weights_version = 0  # published after every change of the weights (:meth:`publish_weights`)
        self.residency: Residency | None = None  # set by Residency.register (train.offload_idle_role)

    def publish_weights(self) -> None:
        """Announce new weights: a sampler with its own copy (vLLM, a bf16 copy) reloads it before it next samples.
        Every path that writes the weights calls it: an update, :meth:`load_weights`, a phase's re-initialisation,
        a resume."""
        self.weights_version += 1

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """The trained model takes ``state`` (another role's weights, a saved copy), published to the samplers."""
        self.model.load_state_dict(state)
        self.publish_weights()

    def phase_step(self, index: int, total: int) -> None:
        """Call before each step of a phase of ``total`` steps (``index`` 0-based): at its first step a fresh AdamW
        when ``optimizer_reset`` is ``phase`` and the KL reference set to the current weights when ``kl_reference``
        is ``phase_start``; at every step the lr of ``lr_schedule``. The lr and the reset depend only on
        (index, total), so a resumed run gets what it would have had; the moved reference is checkpointed
        (:attr:`checkpointed_reference`)."""
        if index == 0 and self.settings.optimizer_reset == "phase":
            self.optimizer.state.clear()
        if index == 0 and self.settings.kl_reference == "phase_start" and self.reference is not None:
            self._copy_weights_into(self.reference)
        set_lr(self.optimizer, self.settings.lr * phase_lr_factor(self.settings, index, total))

    @torch.no_grad()
    def _copy_weights_into(self, reference: torch.nn.Module) -> None:
        """The reference takes the current weights, copied into its own tensors (no second copy is allocated; with
        FSDP each rank copies its shards, which the two models split alike)."""
        for frozen, live in zip(reference.parameters(), self.model.parameters(), strict=True):
            frozen.copy_(live)

    @property
    def checkpointed_reference(self) -> torch.nn.Module | None:
        """The reference a checkpoint must hold: one that phases move (``kl_reference: phase_start``); an initial
        reference is rebuilt from the run's model on resume, so it is not saved."""
        return self.reference if self.settings.kl_reference == "phase_start" else None

    def make_resident(self) -> None:
        """Bring this role's weights and optimizer state onto the accelerator when roles take turns there."""
        if self.residency is not None:
            self.residency.activate(self)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @torch.no_grad()
    def _frozen_logprobs(self, model, samples: Sequence[TrainSample]) -> torch.Tensor:
        """[B, T] log-probs of every sample; with several processes each rank computes its share and all gather."""
        was_training = model.training
        model.eval()
        width = max(len(s.completion_ids) for s in samples)
        first, last = distributed.shard_bounds(len(samples))
        mine = torch.zeros(last - first, width, device=self.device)
        with distributed.full_weights(model):  # ranks' shares take different numbers of passes
            # in sample order, as one process cuts them
            for idx in micro_batches(model, samples, range(first, last), self.settings):
                with self._autocast():
                    lp, _ = sequence_logprobs(model, [samples[i] for i in idx], self.pad_id, self.settings.temperature)
                rows, = _to_device(self.device, torch.tensor(idx) - first)
                mine[rows, width - lp.shape[1]:] = lp
        model.train(was_training)
        if distributed.world_size() == 1:
            return mine
        return torch.cat(distributed.all_gather_objects(mine.cpu())).to(self.device)  # objects travel via the host

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _autocast(self):
        """bf16 mixed precision for forward passes when ``dtype`` is bf16 (weights and optimizer stay fp32)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.settings.dtype == "bf16")

    def _reference_logprobs(self, samples: Sequence[TrainSample]) -> torch.Tensor | None:
        if self.settings.kl_beta <= 0:
            return None
        if self.reference is not None:
            return self._frozen_logprobs(self.reference, samples)
        with self.model.disable_adapter():  # LoRA: the base weights are the reference
            return self._frozen_logprobs(self.model, samples)

    def update(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """Run ``epochs`` passes of mini-batch AdamW steps over the samples; returns mean statistics.

        A mini-batch whose loss or gradient is not finite is skipped (no optimizer step) and counted
        in ``skipped_steps``.
        """
        samples = [s for s in samples if s.completion_ids]
        if not samples:
            return {"loss": 0.0, "optimizer_steps": 0, "skipped_steps": 0}
        self.make_resident()
        st = self.settings = self._fit_passes()
        width = max(len(s.completion_ids) for s in samples)
        mini = st.mini_batch_size or len(samples)
        # One optimizer step over the whole batch: pi_old is the current policy, so its log-probs are the loss
        # pass's own (detached) and the extra no-grad forward is skipped.
        single_step = st.epochs == 1 and mini >= len(samples)
        old = None if single_step else self._frozen_logprobs(self.model, samples)
        ref = self._reference_logprobs(samples)
        rollout = _right_aligned([s.rollout_logprobs for s in samples], width).to(self.device)
        order_rng = random.Random(self.seed * UPDATE_SEED_STRIDE + self.updates_done)
        totals: dict[str, float] = {}
        steps = skipped = 0
        self.model.train()
        for _ in range(st.epochs):
            order = list(range(len(samples)))
            order_rng.shuffle(order)
            for start in range(0, len(order), mini):
                stats = self._optimizer_step(samples, order[start:start + mini], old, ref, rollout, width)
                if stats is None:
                    skipped += 1
                    continue
                steps += 1
                for k, v in stats.items():
                    totals[k] = max(totals.get(k, v), v) if k.endswith("_max") else totals.get(k, 0.0) + v
        self.model.eval()
        self.updates_done += 1
        if steps:
            self.publish_weights()
        result = {k: v if k.endswith("_max") else v / max(steps, 1) for k, v in totals.items()}
        result.update(optimizer_steps=steps, skipped_steps=skipped)
        if st.fit_memory and st.micro_batch_tokens:
            result["pass_tokens"] = st.micro_batch_tokens
            if st.gradient_checkpointing:
                result["checkpointed_layers"] = self.checkpointed_layers
        return result

    def _fit_passes(self) -> UpdateSettings:
        """The settings of this update: with ``fit_memory`` on CUDA, ``micro_batch_tokens`` (the configured budget)
        lowered to the tokens a pass can take in the free device memory, and with ``selective_checkpointing`` only as
        many decoder layers checkpointed as that needs (:func:`coevolve.memory.plan_training_pass`); the memory the
        update itself will take first (gradients, AdamW state, autocast's bf16 weight copies) is not free for it."""
        st = self.configured
        free = free_device_memory(self.device) if st.fit_memory and st.micro_batch_tokens else None
        if free is None or st.micro_batch_tokens is None:
            return st
        layers = decoder_layers(self.model)
        selective = st.selective_checkpointing and layers is not None and all(
            hasattr(layer, "gradient_checkpointing") for layer in layers)
        plan = plan_training_pass(free - self._update_state_bytes(), ModelShape.of(self.model.config),
                                  st.micro_batch_tokens, dtype_bytes=2 if st.dtype == "bf16" else 4,
                                  checkpointing=st.gradient_checkpointing, selective=selective)
        if selective and layers is not None:
            for index, layer in enumerate(layers):  # transformers' GradientCheckpointingLayer reads its flag per call
                layer.gradient_checkpointing = index < plan.checkpointed_layers
        return replace(st, micro_batch_tokens=plan.tokens)

    @property
    def checkpointed_layers(self) -> int:
        """Decoder layers that recompute their activations in the backward pass."""
        if not self.settings.gradient_checkpointing:
            return 0
        layers = decoder_layers(self.model) or []
        return sum(bool(getattr(layer, "gradient_checkpointing", True)) for layer in layers)

    def _update_state_bytes(self) -> int:
        """Device bytes an update allocates beyond its activations that are not allocated now: the gradients, the
        AdamW moments before the first step (8 bytes per fp32 parameter, about 2 with ``adamw_8bit``), and under bf16
        autocast the cached bf16 copies of the trained weights."""
        trained = [p for p in self.model.parameters() if p.requires_grad]
        missing = sum(p.numel() * p.element_size() for p in trained if p.grad is None)
        if not self.optimizer.state:
            missing += sum(adam_state_bytes(p.numel(), p.element_size(), eight_bit=self.settings.optimizer ==
                                            "adamw_8bit") for p in trained)
        if self.settings.dtype == "bf16":
            missing += sum(2 * p.numel() for p in trained if p.dtype == torch.float32)
        return missing

    def _optimizer_step(self, samples, indices, old, ref, rollout, width) -> dict[str, float] | None:
        """One AdamW step on the mini-batch ``indices``. With several processes each rank takes its share of the
        mini-batch and the gradients are summed over ranks; the loss is normalised by the whole mini-batch's totals,
        so the summed gradient is the one-process gradient."""
        st = self.settings
        self.optimizer.zero_grad(set_to_none=True)
        batch = [samples[i] for i in indices]
        total_tokens = sum(s.model_tokens for s in batch)
        agg_totals = {"total_tokens": total_tokens, "total_sequences": len(batch)}
        stats_sum: dict[str, float] = {}
        stats_max: dict[str, float] = {}
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # read once, after the last pass
        nonfinite = False
        first, last = distributed.shard_bounds(len(indices))
        cuts = micro_batches(self.model, samples, _micro_batch_order(self.model, samples, indices[first:last]), st)
        # Sharded, every rank runs as many forward/backward passes as the rank with the most.
        passes = max(distributed.all_gather_objects(len(cuts))) if st.fsdp else len(cuts)
        for k in range(passes):
            idx = cuts[k] if k < len(cuts) else []
            if not idx or nonfinite:
                self._idle_pass(samples[indices[0]])
                continue
            part = [samples[i] for i in idx]
            rows, advantages = _to_device(self.device, torch.tensor(idx),
                                          torch.tensor([s.advantage for s in part], dtype=torch.float32))
            with self._autocast():
                logprobs, mask, entropy = completion_logprobs(self.model, part, self.pad_id, st.temperature,
                                                              entropy=st.entropy_coef != 0)
            cols = slice(width - logprobs.shape[1], width)
            loss, stats = policy_loss(
                logprobs, logprobs.detach() if old is None else old[rows, cols], advantages, mask,
                clip_low=st.clip_low, clip_high=_clip_high(part, st.clip_high), dual_clip=st.dual_clip,
                tis_cap=st.tis_cap,
                rollout_logprobs=rollout[rows, cols],
                ref_logprobs=ref[rows, cols] if ref is not None else None, beta=st.kl_beta, kl_clamp=st.kl_clamp,
                entropy=entropy, entropy_coef=st.entropy_coef,
                agg=st.loss_agg, norm_constant=st.norm_constant, **agg_totals,
            )
            if stats["nonfinite"]:  # the loss's own finiteness included
                nonfinite = True
                if self.settings.fsdp:  # finish the pass like the other ranks; the step is skipped on all of them
                    loss.backward()
                    continue
                break
            loss.backward()
            loss_sum += loss.detach()
            share = stats["n_tokens"] / max(total_tokens, 1)  # token-level statistics, weighted by tokens
            for name, v in stats.items():
                if name.endswith("_max"):
                    stats_max[name] = max(stats_max.get(name, -math.inf), float(v))
                elif name not in ("n_tokens", "n_sequences", "nonfinite"):
                    stats_sum[name] = stats_sum.get(name, 0.0) + float(v) * share
        shares = distributed.all_gather_objects((nonfinite, float(loss_sum), stats_sum, stats_max))
        if any(bad for bad, *_ in shares):
            log.warning("non-finite loss in a mini-batch; optimizer step skipped")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        loss_sum = sum(part_loss for _, part_loss, _, _ in shares)
        stats_sum = {k: sum(part.get(k, 0.0) for _, _, part, _ in shares)
                     for k in set().union(*(part for _, _, part, _ in shares))}
        stats_max = {k: max(part[k] for *_, part in shares if k in part)
                     for k in set().union(*(part for *_, part in shares))}
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.settings.fsdp:  # FSDP summed them into each rank's shard in backward
            distributed.all_reduce_gradients(params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, st.grad_clip if st.grad_clip > 0 else math.inf))
        if not math.isfinite(grad_norm):
            log.warning("non-finite gradient norm; optimizer step skipped")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        return {"loss": loss_sum, "grad_norm": grad_norm, **stats_sum, **stats_max}

    def _idle_pass(self, sample: TrainSample) -> None:
        """A forward and backward pass that adds nothing to the gradients: a sharded model's ranks must run the
        same number of passes (each gathers weights and reduce-scatters gradients with the others)."""
        with self._autocast():
            logprobs, _ = sequence_logprobs(self.model, [sample], self.pad_id, self.settings.temperature)
        (logprobs.sum() * 0.0).backward()
