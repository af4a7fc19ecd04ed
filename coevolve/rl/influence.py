"""INFUSER's optimizer-aware influence score, computed by streaming (paper §2.2-2.3, App. D).

For a generated question (q, a_φ) with solver rollouts a^1..a^n and mean-centred advantages, the score is

    ĝ      = ∇_θ 𝒥_θ(q, a_φ)                              gradient of the clipped objective (2.10) on its rollouts
    Γ̂      = ĝ / ( sqrt( (β2·v + (1−β2)·ĝ²) / (1 − β2^t) ) + eps )     (D.4), elementwise
    ŝ(q)   = ⟨ĝ_dev, Γ̂⟩ / (‖ĝ_dev‖·‖Γ̂‖)                   (2.13)

with v, β2, eps the solver AdamW's live ``exp_avg_sq`` and constants, and t = (optimizer steps taken) + 1. The
optimizer state is only read. Before the first step the state is empty: v = 0, t = 1, so Γ̂ = ĝ / (|ĝ| + eps),
about sign(ĝ) (as the released code). eps sits outside the root, as in torch's AdamW and the paper's App. D.3 (the
typeset D.4 has it inside). ``precondition=False`` is the ``sgd_cosine`` ablation: Γ̂ = ĝ.

Streaming (App. D.3): one question at a time, its gradient goes into the parameters' ``.grad`` buffers (zeroed and
reused), and Γ̂ is formed chunk by chunk of each parameter, accumulating only three scalars ⟨Γ̂, ĝ_dev⟩, ‖Γ̂‖² and
‖ĝ‖². Besides the model and its optimizer state, the phase holds the gradient buffer, ĝ_dev and one chunk of
temporaries; no per-question parameter-sized tensor is kept. Its cost is one forward and backward per rollout (the
old log-probs are the current ones, θ = θ_old, so the ratio is 1 and no extra forward is needed) plus an elementwise
pass over the parameters per question.

Norms are clamped at 1e-12; a zero gradient scores 0.

Diagnostics (is the score signal or noise?): :func:`dev_gradient` also returns the cosine between the dev gradients of
two disjoint halves of the dev set (how reproducible ĝ_dev is), and :func:`one_step_dev_gains` the change in dev reward
after one real update on a single question, which ŝ approximates to first order (our validity check).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from coevolve.optim_state import copy_state_dict
from coevolve.rl.losses import policy_loss
from coevolve.rl.trainer import PolicyTrainer, TrainSample, sequence_logprobs

CHUNK = 1 << 20  # elements per streamed slice of a parameter
NORM_FLOOR = 1e-12


def trainable(trainer: PolicyTrainer) -> list[torch.nn.Parameter]:
    """The parameters the trainer's optimizer updates (LoRA: the adapters only), in optimizer order."""
    return [p for group in trainer.optimizer.param_groups for p in group["params"]]


def batch_totals(samples: Sequence[TrainSample]) -> dict[str, int]:
    """The mini-batch totals the loss aggregation divides by: completion tokens and sequences."""
    return {"total_tokens": sum(len(s.completion_ids) for s in samples), "total_sequences": len(samples)}


def accumulate_policy_gradient(trainer: PolicyTrainer, samples: Sequence[TrainSample],
                               totals: Mapping[str, int] | None = None) -> None:
    """Add ∇_θ of the trainer's clipped objective (2.10) on ``samples`` to ``.grad`` at θ_old = θ (no step).

    The samples form one mini-batch: the loss aggregation (``loss_agg``, Dr.GRPO's C, token totals) is the one
    ``trainer.update`` would use for them, so this is the gradient of one update on exactly these samples. With
    ``totals`` of a larger mini-batch it is these samples' share of that mini-batch's gradient instead. The ratio is 1
    (the clip is inactive); TIS weights min(π_old/π_rollout, cap) apply when ``tis_cap`` is set.
    """
    st = trainer.settings
    samples = [s for s in samples if s.completion_ids]
    if not samples:
        return
    totals = dict(totals) if totals is not None else batch_totals(samples)
    trainer.make_resident()
    was_training = trainer.model.training
    trainer.model.train()
    for start in range(0, len(samples), st.micro_batch_size):
        part = samples[start:start + st.micro_batch_size]
        logprobs, mask = sequence_logprobs(trainer.model, part, trainer.pad_id, st.temperature)
        width = logprobs.shape[1]
        rollout = torch.zeros_like(logprobs)
        for row, s in enumerate(part):
            if s.rollout_logprobs:
                rollout[row, width - len(s.rollout_logprobs):] = torch.tensor(s.rollout_logprobs)
        loss, _ = policy_loss(
            logprobs, logprobs.detach(),
            torch.tensor([s.advantage for s in part], dtype=torch.float32, device=logprobs.device), mask,
            clip_low=st.clip_low, clip_high=st.clip_high, tis_cap=st.tis_cap,
            rollout_logprobs=rollout if st.tis_cap else None, agg=st.loss_agg, norm_constant=st.norm_constant,
            **totals)
        loss.backward()
    trainer.model.train(was_training)


@dataclass(frozen=True)
class DevGradient:
    """ĝ_dev, its norm, and the cosine between the parts two halves of the dev set contribute to it."""

    grads: list[torch.Tensor]  # one tensor per trainable parameter
    norm: float
    half_cosine: float  # NaN when a half has no rollouts


def dev_gradient(trainer: PolicyTrainer, first: Sequence[TrainSample],
                 second: Sequence[TrainSample] = ()) -> DevGradient:
    """ĝ_dev (2.11): the solver's policy gradient on the dev rollouts of ``first`` and ``second`` together.

    Pass the rollouts of the dev groups with non-zero variance and their mean-centred advantages; with the
    per-sequence aggregations and n rollouts per question this is the per-question average the paper writes.
    Each half's part is its share of the gradient of the loss over both (the same aggregation totals): the parts sum
    to ĝ_dev, and each is its half's own gradient times a positive factor, so ``half_cosine`` is the cosine between
    two independent estimates of the dev gradient. The ``.grad`` buffers are zeroed afterwards; the optimizer is not
    touched.
    """
    params = trainable(trainer)
    first, second = [s for s in first if s.completion_ids], [s for s in second if s.completion_ids]
    totals = batch_totals([*first, *second])
    trainer.optimizer.zero_grad(set_to_none=True)
    accumulate_policy_gradient(trainer, first, totals)
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    trainer.optimizer.zero_grad(set_to_none=True)
    accumulate_policy_gradient(trainer, second, totals)
    dot = first_sq = second_sq = 0.0
    for g, p in zip(grads, params):
        first_sq += float(g.double().square().sum())
        if p.grad is not None:
            dot += float((g.double() * p.grad.double()).sum())
            second_sq += float(p.grad.double().square().sum())
            g.add_(p.grad)
    trainer.optimizer.zero_grad(set_to_none=True)
    floor = NORM_FLOOR ** 2
    cosine = dot / math.sqrt(first_sq * second_sq) if first_sq > floor and second_sq > floor else float("nan")
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    return DevGradient(grads, norm, cosine)


@dataclass(frozen=True)
class InfluenceStats:
    """One question's score and the two norms behind it."""

    score: float
    grad_norm: float  # ‖ĝ‖
    direction_norm: float  # ‖Γ̂‖


Preconditioner = tuple[torch.Tensor | None, int, float, float]  # (v_{t-1} or None, t, β2, eps)


def adam_preconditioners(optimizer: torch.optim.Optimizer,
                         params: Sequence[torch.nn.Parameter]) -> list[Preconditioner]:
    """For each parameter of a torch Adam/AdamW: its live ``exp_avg_sq`` (None while the state is empty), t = its
    step count + 1, β2 and eps. Read only."""
    constants = {id(p): (float(g["betas"][1]), float(g["eps"])) for g in optimizer.param_groups for p in g["params"]}
    out = []
    for param in params:
        state = optimizer.state.get(param, {})
        steps = int(state["step"]) if "step" in state else 0
        out.append((state.get("exp_avg_sq"), steps + 1, *constants[id(param)]))
    return out


def influence_of_gradient(params: Sequence[torch.nn.Parameter], dev: Sequence[torch.Tensor], dev_norm: float,
                          preconditioners: Sequence[Preconditioner] | None) -> InfluenceStats:
    """ŝ for the gradient now in ``params[i].grad`` (2.13), streamed in slices; ``preconditioners`` None: Γ̂ = ĝ."""
    dot = direction_sq = grad_sq = 0.0
    for i, (param, target) in enumerate(zip(params, dev)):
        if param.grad is None:
            continue
        g_flat, d_flat = param.grad.reshape(-1), target.reshape(-1)
        if preconditioners is not None:
            v, t, beta2, eps = preconditioners[i]
            v_flat = v.reshape(-1) if v is not None else None
            correction = 1.0 - beta2 ** t
        for start in range(0, g_flat.numel(), CHUNK):
            g, d = g_flat[start:start + CHUNK], d_flat[start:start + CHUNK]
            grad_sq += float(torch.dot(g, g))
            if preconditioners is None:
                direction = g
            else:  # one chunk-sized buffer: (β2 v + (1 - β2) g²) / (1 - β2^t), then sqrt + eps, then g / it
                if v_flat is None:
                    direction = torch.mul(g, g).mul_((1.0 - beta2) / correction)
                else:
                    direction = torch.mul(v_flat[start:start + CHUNK], beta2 / correction)
                    direction.addcmul_(g, g, value=(1.0 - beta2) / correction)
                direction.sqrt_().add_(eps)
                torch.div(g, direction, out=direction)
            dot += float(torch.dot(direction, d))
            direction_sq += float(torch.dot(direction, direction))
    direction_norm, grad_norm = direction_sq ** 0.5, grad_sq ** 0.5
    if direction_norm <= NORM_FLOOR or dev_norm <= NORM_FLOOR:
        return InfluenceStats(0.0, grad_norm, direction_norm)
    return InfluenceStats(dot / (dev_norm * direction_norm), grad_norm, direction_norm)


def influence_scores(trainer: PolicyTrainer, questions: Sequence[Sequence[TrainSample]], dev: Sequence[torch.Tensor],
                     precondition: bool = True) -> list[InfluenceStats]:
    """ŝ(q, a_φ) for each question's rollouts (Phase 4 of Algorithm 1), one backward per question, streamed.

    ``precondition`` False is the ``sgd_cosine`` ablation. The solver's weights and optimizer state are unchanged;
    the ``.grad`` buffers are left empty.
    """
    trainer.make_resident()
    params = trainable(trainer)
    dev_norm = float(sum(float(d.double().square().sum()) for d in dev)) ** 0.5
    preconditioners = adam_preconditioners(trainer.optimizer, params) if precondition else None
    scores = []
    trainer.optimizer.zero_grad(set_to_none=False)
    for rollouts in questions:
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        accumulate_policy_gradient(trainer, rollouts)
        scores.append(influence_of_gradient(params, dev, dev_norm, preconditioners))
    trainer.optimizer.zero_grad(set_to_none=True)
    return scores


@torch.no_grad()
def _logprob_sums(trainer: PolicyTrainer, samples: Sequence[TrainSample]) -> torch.Tensor:
    """log π_θ(a | q) of each sample's whole completion (float64), in micro-batches."""
    sums = []
    for start in range(0, len(samples), trainer.settings.micro_batch_size):
        part = samples[start:start + trainer.settings.micro_batch_size]
        logprobs, mask = sequence_logprobs(trainer.model, part, trainer.pad_id, trainer.settings.temperature)
        sums.append((logprobs.double() * mask).sum(1))
    return torch.cat(sums)


def one_step_dev_gains(trainer: PolicyTrainer, questions: Sequence[Sequence[TrainSample]],
                       dev: Sequence[TrainSample], dev_rollouts: int) -> list[float]:
    """For each question, the change in mean dev reward after one real solver update on its rollouts alone.

    A validity check of ŝ (ŝ is the first-order term of this change). The change is estimated
    on dev rollouts sampled from the current solver π_θ by importance weighting,

        ΔĴ ≈ (1 / dev_rollouts) Σ_i A_i (π_θ'(a_i | q_i) / π_θ(a_i | q_i) - 1),    A_i = r_i - mean of its group,

    over ``dev``, the rollouts of the informative dev groups with their mean-centred advantages (the group baseline
    does not change the expectation, and zero-variance groups add nothing); ``dev_rollouts`` counts all dev rollouts.
    Rollouts independent of the ones behind ĝ_dev give the actual change; Phase 1's own share ĝ_dev's noise.
    The update is ``trainer.update`` on the question's rollouts (one AdamW step when they fit one mini-batch). The
    weights, optimizer state and update count are restored after each question.
    """
    trainer.make_resident()
    model, was_training = trainer.model, trainer.model.training
    model.eval()
    before = _logprob_sums(trainer, dev)
    advantages = torch.tensor([s.advantage for s in dev], dtype=torch.float64, device=before.device)
    weights = copy.deepcopy(model.state_dict())
    optimizer_state = copy_state_dict(trainer.optimizer.state_dict())
    updates_done = trainer.updates_done
    gains = []
    for rollouts in questions:
        trainer.update(rollouts)
        ratio = torch.exp(_logprob_sums(trainer, dev) - before)
        gains.append(float((advantages * (ratio - 1.0)).sum()) / dev_rollouts)
        trainer.load_weights(weights)
        trainer.optimizer.load_state_dict(copy_state_dict(optimizer_state))  # loading may keep the given tensors
        trainer.updates_done = updates_done
    trainer.optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    return gains
