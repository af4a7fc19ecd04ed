"""Log-probs of target tokens from a causal LM's last hidden states, with the output head run in chunks of tokens.

The plain way, ``model(...).logits`` and then a fp32 log-sum-exp, materialises [tokens, vocabulary] logits in the
autocast dtype and again in fp32, and autograd keeps the fp32 copy for the backward pass: about 12 bytes per token and
vocabulary entry (7.5 GB for 4,096 tokens of Qwen2.5's 151,936). :func:`head_logprobs` computes the head's logits for
a chunk of tokens at a time and keeps only each token's log-sum-exp; its backward pass recomputes a chunk's logits and
turns them into the gradients of the hidden states and of the head weight. Memory stays at one chunk's logits, for one
more head matmul per token, so it is used only where the whole logits would exceed a chunk (:func:`split_model`): not
for the small models and micro-batches of a CPU run, always for a Qwen2.5 micro-batch of a few thousand tokens. The
arithmetic is the plain path's (the head's matmul in the autocast dtype, then fp32, then ``/ temperature``, then target
logit minus log-sum-exp), so the log-probs are the same up to summation order. On request it also returns each token's
entropy of the whole distribution (``train.entropy_coef``), computed and differentiated chunk by chunk as well. That
is not free, so the trainer asks for it only when ``entropy_coef`` is not 0: on an H100 under bf16 autocast, Qwen2.5's
head (896 x 151,936) over 16,384 tokens took 118 ms forward and backward without it and 178 ms with it, and one more
chunk of memory (peak 3.3 -> 4.25 GiB); the entropies matched a plain fp32 computation to 3e-7 (relative).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from coevolve import distributed

# Logits per chunk (tokens x vocabulary entries; 2**28 is 1 GiB in fp32, 1,766 tokens of a 151,936 vocabulary), and
# the size above which a pass's logits are chunked. 0 turns the chunked head off: logits are then computed whole.
HEAD_CHUNK_LOGITS = 1 << 28
# Architectures whose causal-LM forward is exactly ``lm_head(model(...).last_hidden_state)``, no logit scaling or
# soft-capping; others keep the plain path.
CHUNKED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class SplitModel(NamedTuple):
    """A causal LM cut at its output head: ``body`` returns the last hidden states, ``head`` maps them to logits."""

    body: torch.nn.Module
    head: torch.nn.Linear


def split_model(model: torch.nn.Module, tokens: int) -> SplitModel | None:
    """The body and head of ``model`` when the chunked head applies to a pass that predicts ``tokens`` tokens, else
    None (use ``model(...).logits``).

    It applies when ``tokens`` x the vocabulary exceeds ``HEAD_CHUNK_LOGITS`` (which is not 0), to a model
    :func:`cut_at_head` can cut, and not to an FSDP-sharded model (its root unit gathers the embeddings and head only
    in the whole model's forward).
    """
    split = cut_at_head(model) if HEAD_CHUNK_LOGITS else None
    if split is None or tokens * split.head.out_features <= HEAD_CHUNK_LOGITS or distributed.is_sharded(model):
        return None
    return split


def cut_at_head(model: torch.nn.Module) -> SplitModel | None:
    """``model`` cut at its output head: the architectures in ``CHUNKED_MODEL_TYPES``, also LoRA-wrapped (peft),
    whose head is a plain bias-free ``nn.Linear`` (not a LoRA or modules-to-save wrapper); else None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the transformers model
    if getattr(getattr(inner, "config", None), "model_type", None) not in CHUNKED_MODEL_TYPES:
        return None
    body = getattr(inner, "model", None)
    head = inner.get_output_embeddings()
    if body is None or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return SplitModel(body, head)


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature) at ``targets``, in fp32, shaped like ``targets``.

    ``hidden`` is [..., H] (the last hidden states of the predicting positions), ``weight`` the head's [V, H] and
    ``targets`` [...] token ids. The matmul runs in the autocast dtype when autocast is on (as the model's own head
    would), else in ``weight``'s dtype; ``temperature`` 0 or 1 leaves the logits unscaled.
    """
    return _head(hidden, weight, targets, temperature, entropy=False)[0]


def head_logprobs_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`head_logprobs` and the entropy -sum_v p_v log p_v of each token's distribution (same shape, fp32),
    both differentiable."""
    return _head(hidden, weight, targets, temperature, entropy=True)


def _head(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
          entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    chunk = max(1, HEAD_CHUNK_LOGITS // weight.shape[0])
    flat, flat_entropy = _ChunkedHeadLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                                                    targets.reshape(-1), temperature, dtype, chunk, entropy)
    return flat.view(targets.shape), flat_entropy.view(targets.shape) if entropy else flat_entropy


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 [tokens, V] logits of a chunk (``weight`` already in the compute dtype), scaled by the temperature."""
    logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()  # a new tensor: scaled in place
    return logits.div_(temperature) if temperature > 0 and temperature != 1.0 else logits


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """[n] log-probs (and, with ``entropy``, [n] entropies; else an empty tensor) from [n, H] hidden states, chunk by
    chunk; backward recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                dtype: torch.dtype, chunk: int, entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
            out = torch.empty_like(lse)
            ent = torch.empty_like(lse) if entropy else lse.new_empty(0)
            for start in range(0, hidden.shape[0], chunk):
                rows = slice(start, start + chunk)
                logits = _chunk_logits(hidden[rows], w, temperature)
                lse[rows] = logits.logsumexp(-1)
                out[rows] = logits.gather(-1, targets[rows, None])[:, 0] - lse[rows]
                if entropy:  # H = lse - sum_v p_v z_v (verl's entropy_from_logits)
                    ent[rows] = lse[rows] - (logits - lse[rows, None]).exp_().mul_(logits).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        ctx.set_materialize_grads(False)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        if grad is None:
            grad = torch.zeros_like(lse)
        scaled = ctx.temperature > 0 and ctx.temperature != 1.0
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(ctx.dtype)
            for start in range(0, hidden.shape[0], ctx.chunk):
                rows = slice(start, start + ctx.chunk)
                g = grad[rows, None].float()
                log_p = _chunk_logits(hidden[rows], w, ctx.temperature).sub_(lse[rows, None])
                if grad_entropy is None:
                    # d(target logit - log-sum-exp) / d logits = onehot(target) - softmax, times the incoming gradient
                    d_logits = log_p.exp_().mul_(-g)
                else:
                    # dH / d logits = -p (log p + H): with the log-prob's term, onehot * g - p (g + g_H (log p + H))
                    p = log_p.exp()
                    d_logits = log_p.add_(ent[rows, None]).mul_(grad_entropy[rows, None].float()).add_(g).mul_(p).neg_()
                d_logits.scatter_add_(1, targets[rows, None], g)
                if scaled:
                    d_logits.div_(ctx.temperature)
                d_logits = d_logits.to(ctx.dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = d_logits @ w
                if grad_weight is not None:
                    grad_weight += d_logits.T @ hidden[rows].to(ctx.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None
