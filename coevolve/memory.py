"""Device-memory planning for sampling and training: how many rows a decoding batch, and how many tokens a training
pass, can take in the memory that is free.

Pure arithmetic over a model's shape (:class:`ModelShape`) and byte counts, so it is tested on the CPU with given
memory figures; :func:`free_device_memory` reads the figures of a CUDA device. The estimates count what the HF
engine's decoders and the trainer allocate (the KV cache, the per-step logits and their float32/float64 temporaries,
the output buffers; the checkpointed layer inputs and one layer's recomputation) and plan within ``HEADROOM`` of the
free memory, since the caching allocator fragments and kernels take workspaces the arithmetic does not see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEADROOM = 0.85  # share of the free memory a plan may fill
CPU_BATCH_SIZE = 64  # rollout.batch_size "auto" off CUDA (where memory is not the limit that matters)
# Bytes per row and vocabulary entry of one sampling step: the logits in the model's dtype, as float32, the
# temperature-scaled log-softmax and its exp (float32) and the cumulative sums of the draw (float64); top-k / top-p
# add a sort (values and int64 indices) and a second softmax.
STEP_BYTES_PER_LOGIT = 2 + 4 + 4 + 4 + 8
TRUNCATION_BYTES_PER_LOGIT = 4 + 8 + 4 + 4


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that its memory use depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> ModelShape:
        """The shape of a transformers config (its standard attribute names; configs with other names map them)."""
        hidden, heads = config.hidden_size, config.num_attention_heads
        return cls(layers=config.num_hidden_layers, hidden=hidden,
                   intermediate=getattr(config, "intermediate_size", None) or 4 * hidden, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or hidden // heads, vocab=config.vocab_size)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def sampling_bytes(shape: ModelShape, rows: int, slots: int, new_tokens: int, prompt_tokens: int, *,
                   dtype_bytes: int, truncated: bool) -> int:
    """Peak device memory of one decoding batch of ``rows`` prompts: the KV cache of ``slots`` positions per row,
    the prefill of up to ``rows`` distinct prompts of ``prompt_tokens`` (its own cache, its masks and one layer's
    activations; logits of the last position only), one step's logits and sampling temporaries, and the per-token
    outputs."""
    kv = shape.kv_bytes_per_token(dtype_bytes)
    cache = rows * slots * kv
    prefill_tokens = rows * prompt_tokens
    prefill = prefill_tokens * (kv + (4 * shape.hidden + 3 * shape.intermediate) * dtype_bytes)
    prefill += rows * prompt_tokens * prompt_tokens * (dtype_bytes + 1)  # the causal mask, boolean and additive
    step = rows * shape.vocab * (STEP_BYTES_PER_LOGIT + (TRUNCATION_BYTES_PER_LOGIT if truncated else 0))
    outputs = (rows + 1) * new_tokens * (8 + 4 + 8) + rows * slots  # tokens, log-probs, uniforms; padding mask
    return cache + prefill + step + outputs


def plan_sampling_rows(free_bytes: int, shape: ModelShape, prompts: int, prompt_tokens: int, new_tokens: int,
                       slots: int, *, dtype_bytes: int, truncated: bool, buckets: tuple[int, ...] = ()) -> int:
    """The most prompts (at most ``prompts``) one decoding batch can take within ``HEADROOM`` of ``free_bytes``;
    below ``prompts``, rounded down to one of ``buckets`` (the static decoder's batch sizes, so calls share
    buffers and graphs). At least 1: a single row that does not fit is left to fail with the device's own error."""
    budget = int(free_bytes * HEADROOM)

    def fits(rows: int) -> bool:
        return sampling_bytes(shape, rows, slots, new_tokens, prompt_tokens, dtype_bytes=dtype_bytes,
                              truncated=truncated) <= budget

    if fits(prompts):
        return prompts
    low, high = 1, prompts  # fits(low) is assumed; fits(high) is false
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return max([b for b in buckets if b <= low], default=low)


def training_bytes_per_token(shape: ModelShape, *, dtype_bytes: int, checkpointing: bool) -> int:
    """Activation memory per token of a forward/backward pass: with gradient checkpointing, every layer's input kept
    for the backward pass plus one layer recomputed; without it, every layer's activations (attention projections,
    the MLP's gate, up and product, norms)."""
    layer = (6 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 3 * shape.intermediate) * dtype_bytes
    if checkpointing:
        return shape.layers * shape.hidden * dtype_bytes + 2 * layer
    return shape.layers * layer


def plan_pass_tokens(free_bytes: int, shape: ModelShape, cap: int, *, dtype_bytes: int, checkpointing: bool) -> int:
    """Tokens per training pass: ``cap`` when it fits within ``HEADROOM`` of ``free_bytes``, else as many as do
    (at least 1). The log-prob head runs in chunks of its own size, so its logits are not counted per token."""
    per_token = training_bytes_per_token(shape, dtype_bytes=dtype_bytes, checkpointing=checkpointing)
    return max(1, min(cap, int(free_bytes * HEADROOM) // per_token))


def free_device_memory(device: torch.device) -> int | None:
    """Bytes a new allocation on ``device`` can use: the driver's free memory plus what torch's caching allocator
    holds unused, within the process's share of the device (``torch.cuda.set_per_process_memory_fraction``).
    None off CUDA."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda index: 1.0)(index)
    return max(0, min(free + torch.cuda.memory_reserved(device) - allocated, int(total * fraction) - allocated))
