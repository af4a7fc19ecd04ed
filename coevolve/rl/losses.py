"""Token-level clipped policy-gradient loss (PPO / GRPO family) with TIS, k3 KL and three aggregations.

Per completion token t of sequence i (INFUSER eq. 2.10, with DAPO's decoupled clip range):

    rho_{i,t} = exp(logp - old_logp)                                   importance ratio to the behaviour policy
    pg_{i,t}  = -min(rho * A_i, clip(rho, 1 - clip_low, 1 + clip_high) * A_i)
    pg_{i,t}  = min(pg_{i,t}, -c * A_i)  for A_i < 0                     optional dual clip (c = dual_clip)
    pg_{i,t} *= w_{i,t} = min(exp(old_logp - rollout_logp), tis_cap)   truncated importance sampling, detached
    loss_{i,t} = pg_{i,t} + beta * k3_{i,t},  k3 = exp(ref - logp) - (ref - logp) - 1   (KL(pi || pi_ref), k3)
                 (k3 optionally clamped to [-kl_clamp, kl_clamp]: verl's low_var_kl clamps to [-10, 10])
    loss_{i,t} -= entropy_coef * H_{i,t}    H = -sum_v pi(v) log pi(v), the policy's entropy at the token (optional)

then aggregated over completion tokens (``agg``):

- ``"seq_mean"`` (GRPO): mean over each sequence's tokens, then mean over sequences.
- ``"token_sum_norm"`` (Dr.GRPO; INFUSER eq. 2.10 with 1/C): sum over each sequence's tokens / C, then mean over
  sequences. C = ``norm_constant``, default T = mask.shape[1]; pass the configured max generation length to make it a
  true constant. C = 1 gives Dynamic RL's literal "sequence log-likelihood, mean over samples" (Dynamic RL Eq. 14).
- ``"token_mean"`` (DAPO; the released INFUSER and OpenSIR code): sum of all token losses / number of tokens.

Micro-batching. When the trainer splits a mini-batch into micro-batches and accumulates gradients, pass the mini-batch
totals: ``total_tokens`` (completion tokens in the whole mini-batch; used by ``token_mean``) and ``total_sequences``
(sequences in the whole mini-batch; used by ``seq_mean`` and ``token_sum_norm``). The returned loss is then this
micro-batch's share, and the sum of the micro-batch losses (and of their gradients) equals the full mini-batch loss
exactly, so no further rescaling is needed. Passing a total that the chosen ``agg`` does not use is harmless. With
``token_sum_norm`` also pass ``norm_constant``: its default (the padded width T) can differ between micro-batches.
Leaving ``total_tokens`` unset gives a per-micro-batch token mean; averaging those over the micro-batches is what
TRL's GRPOTrainer (OpenSIR's code) does.

The TIS weight multiplies only the policy-gradient term, not the KL or entropy term (as in verl and TRL). The entropy
term is verl's (``policy_loss = pg_loss - entropy_coeff * agg_loss(entropy)``): aggregated like the rest, it is the
same as adding it per token before aggregating.
"""

from __future__ import annotations

import torch

AGG_MODES: tuple[str, ...] = ("seq_mean", "token_sum_norm", "token_mean")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (non-negative, unbiased)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | torch.Tensor = 0.2,
    dual_clip: float | None = None,
    tis_cap: float | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_clamp: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    agg: str = "seq_mean",
    norm_constant: float | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float | bool]]:
    """Clipped surrogate loss to minimise, and detached statistics.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with grad).
        old_logprobs: [B, T] log pi_old recomputed by the trainer before the update (no grad).
        advantages: [B] sequence advantages (broadcast to every token) or [B, T] token advantages.
        mask: [B, T] bool or 0/1 float; non-zero marks completion tokens that enter the loss.
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high] (DAPO "clip-higher" when unequal);
            ``clip_high`` may be a [B] tensor, one bound per sequence (ADPO's, :func:`ambiguity_clip_high`).
        dual_clip: if set (c > 1, e.g. 3.0 in Prism's verl), the loss for A < 0 is capped at -c * A (dual-clip PPO).
        tis_cap: truncation rho_max of the TIS weight (INFUSER: 2.0). TIS is applied only when both ``tis_cap`` and
            ``rollout_logprobs`` are given (leave it off when one engine both samples and trains).
        rollout_logprobs: [B, T] log-probs reported by the sampling engine (may differ from ``old_logprobs``); without
            ``tis_cap`` they only feed the ``rollout_ratio_*`` statistics.
        ref_logprobs: [B, T] log pi_ref of a frozen reference; required when ``beta`` > 0 (with ``beta`` = 0 it
            only feeds ``stats["kl_mean"]``).
        beta: k3 KL coefficient.
        kl_clamp: if set, each token's k3 is clamped to [-kl_clamp, kl_clamp] before it enters the loss and
            ``kl_mean`` (verl's ``low_var_kl``: 10); a clamped token's KL term has no gradient.
        entropy: [B, T] entropy of the policy's distribution at each token (with grad when ``entropy_coef`` is not 0);
            required when ``entropy_coef`` is not 0 (with 0 it only feeds ``stats["entropy"]``).
        entropy_coef: entropy bonus coefficient: ``entropy_coef * H`` is subtracted from each token's loss.
        agg: one of ``AGG_MODES``; see the module docstring.
        norm_constant: Dr.GRPO's C for ``token_sum_norm``; default mask.shape[1].
        total_tokens, total_sequences: mini-batch totals for exact gradient accumulation (module docstring).

    Returns:
        (loss, stats). ``stats`` holds python values over this call's completion tokens: ``ratio_mean``,
        ``clip_frac_low`` (rho < 1 - clip_low with A < 0), ``clip_frac_high`` (rho > 1 + clip_high with A > 0),
        ``dual_clip_frac``, ``kl_mean`` (k3, 0 without a reference), ``entropy`` (mean over tokens; only when
        ``entropy`` is given), ``tis_clip_frac`` (raw weight above the cap),
        ``tis_weight_mean``, ``rollout_ratio_mean`` / ``rollout_ratio_max`` (raw pi_old / pi_rollout over completion
        tokens, 1 without rollout log-probs: the sampler-trainer mismatch), ``n_tokens``, ``n_sequences`` and
        ``nonfinite``: True when a masked input value, a
        per-token ratio or loss, or the loss is NaN/inf. The loss is returned unchanged in that case; the caller must
        skip the step.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs, old_logprobs and mask must share shape [B, T]; got {tuple(logprobs.shape)}, "
            f"{tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    for name, x in (("rollout_logprobs", rollout_logprobs), ("ref_logprobs", ref_logprobs)):
        if x is not None and x.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(logprobs.shape)}")
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    if entropy is not None and entropy.shape != logprobs.shape:
        raise ValueError(f"entropy has shape {tuple(entropy.shape)}, expected {tuple(logprobs.shape)}")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    use_tis = tis_cap is not None and rollout_logprobs is not None

    m = mask != 0
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    adv_in = advantages.detach().to(logprobs.dtype).expand_as(logprobs)
    inputs = [logprobs, old_logprobs, adv_in]
    inputs += [x for x in (rollout_logprobs if use_tis else None, ref_logprobs, entropy) if x is not None]

    # Padding positions may hold anything (even inf); torch.where keeps them out of the loss and out of the gradient.
    def masked(x: torch.Tensor) -> torch.Tensor:
        return torch.where(m, x, torch.zeros_like(x))

    logp = masked(logprobs)
    old = masked(old_logprobs.detach())
    adv = masked(adv_in)

    ratio = torch.exp(logp - old)
    if isinstance(clip_high, torch.Tensor):  # one upper bound per sequence
        clip_high = clip_high.detach().to(device=logprobs.device, dtype=logprobs.dtype).reshape(-1, 1)
        clipped_ratio = torch.minimum(torch.clamp(ratio, min=1.0 - clip_low), 1.0 + clip_high)
    else:
        clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_tok = torch.maximum(-ratio * adv, -clipped_ratio * adv)
    if dual_clip is not None:
        dual_active = (adv < 0) & (loss_tok > -dual_clip * adv)
        loss_tok = torch.where(dual_active, -dual_clip * adv, loss_tok)
    if rollout_logprobs is not None:  # pi_old / pi_rollout: 1 when one engine samples and trains
        raw_w = torch.exp(old - masked(rollout_logprobs.detach()))
    if use_tis:
        weight = torch.clamp(raw_w, max=tis_cap)
        loss_tok = loss_tok * weight
    if ref_logprobs is not None:
        kl = k3_kl(logp, masked(ref_logprobs.detach()))
        if kl_clamp is not None:
            kl = torch.clamp(kl, min=-kl_clamp, max=kl_clamp)
        if beta != 0.0:
            loss_tok = loss_tok + beta * kl
    if entropy_coef != 0.0:
        loss_tok = loss_tok - entropy_coef * masked(entropy)

    mf = m.to(logprobs.dtype)
    n_seq = float(total_sequences) if total_sequences is not None else float(logprobs.shape[0])
    if agg == "token_mean":
        denom = float(total_tokens) if total_tokens is not None else mf.sum().clamp(min=1.0)
        loss = (loss_tok * mf).sum() / denom
    elif agg == "seq_mean":
        loss = ((loss_tok * mf).sum(dim=1) / mf.sum(dim=1).clamp(min=1.0)).sum() / n_seq
    else:  # token_sum_norm
        c = float(norm_constant) if norm_constant is not None else float(logprobs.shape[1])
        loss = ((loss_tok * mf).sum(dim=1) / c).sum() / n_seq

    with torch.no_grad():  # the statistics stay on the device until one read at the end
        n_tok = mf.sum()
        denom_stats = n_tok.clamp(min=1.0)

        def frac(cond: torch.Tensor) -> torch.Tensor:
            return (cond & m).sum() / denom_stats

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * mf).sum() / denom_stats

        # A finite loss can still carry NaN gradients (an overflowed ratio on a clipped token gives 0 * inf in
        # exp's backward), so the per-token intermediates are checked too, not only the inputs and the loss.
        nonfinite = torch.stack([*((~torch.isfinite(x.detach()) & m).any() for x in inputs),
                                 ~torch.isfinite(ratio).all(), ~torch.isfinite(loss_tok.detach()).all(),
                                 ~torch.isfinite(loss.detach())]).any()
        measured: dict[str, torch.Tensor | float] = {
            "ratio_mean": mean(ratio),
            "clip_frac_low": frac((ratio < 1.0 - clip_low) & (adv < 0)),
            "clip_frac_high": frac((ratio > 1.0 + clip_high) & (adv > 0)),
            "dual_clip_frac": frac(dual_active) if dual_clip is not None else 0.0,
            "kl_mean": mean(kl) if ref_logprobs is not None else 0.0,
            **({"entropy": mean(masked(entropy.detach()))} if entropy is not None else {}),
            "tis_clip_frac": frac(raw_w > tis_cap) if use_tis else 0.0,
            "tis_weight_mean": mean(weight) if use_tis else 1.0,
            "rollout_ratio_mean": mean(raw_w) if rollout_logprobs is not None else 1.0,
            # 1 when no token is in the mask (all ones then)
            "rollout_ratio_max": torch.where(m, raw_w, torch.ones_like(raw_w)).max()
            if rollout_logprobs is not None and m.numel() else 1.0,
            "n_tokens": n_tok,
            "n_sequences": float(logprobs.shape[0]),
            "nonfinite": nonfinite,
        }
        on_device = {k: v for k, v in measured.items() if isinstance(v, torch.Tensor)}
        read = dict(zip(on_device, torch.stack([v.double() for v in on_device.values()]).tolist()))
        stats: dict[str, float | bool] = {k: read.get(k, v) for k, v in measured.items()}
        stats["nonfinite"] = bool(stats["nonfinite"])
    return loss, stats


def ambiguity_clip_high(p: float, clip: float, low: float, high: float, bonus: float) -> float:
    """ADPO's upper clip range of a task with self-consistency ``p`` (Agent0's ``compute_policy_loss_adpo``):
    ``clip + bonus * clamp((high - p) / (high - low), 0, 1)``: the full bonus at p <= low, none at p >= high, so the
    less consistent (more ambiguous) a task's pseudo-label, the further a low-probability token may be pushed up."""
    return clip + bonus * min(max((high - p) / (high - low), 0.0), 1.0)
