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
from typing import Literal

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

    def lora_parameters(self, rank: int) -> int:
        """Parameters of rank-``rank`` LoRA adapters on every linear layer of the decoder (peft's all-linear): each
        layer's query, key, value and output projections and its three MLP projections, (inputs + outputs) x rank."""
        queries, keys = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * (self.hidden + queries) + 2 * (self.hidden + keys) + 3 * (self.hidden + self.intermediate)
        return rank * self.layers * per_layer


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


# Bytes per token and layer that a transformers decoder layer keeps for its backward pass under bf16 autocast with
# fp32 master weights (or in fp32): seven fp32 vectors of the hidden size (the residual stream, the two RMSNorms'
# inputs and outputs, the rotary products), and in the compute dtype one more hidden vector, the keys and values and
# four MLP vectors. Measured on the CPU with saved-tensor hooks on Qwen2-shaped layers (four shapes, bf16 autocast and
# fp32, exact to 24 bytes); a checkpointed layer keeps only its fp32 input.
FP32_HIDDEN_VECTORS = 7
CHECKPOINTED_LAYER_BYTES_PER_HIDDEN = 4


def layer_activation_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes per token one decoder layer keeps for the backward pass when it is not checkpointed."""
    return (4 * FP32_HIDDEN_VECTORS * shape.hidden
            + (shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate) * dtype_bytes)


def training_bytes_per_token(shape: ModelShape, *, dtype_bytes: int, checkpointed_layers: int) -> int:
    """Activation memory per token of a forward/backward pass with ``checkpointed_layers`` of the layers checkpointed:
    those keep only their input, the others all their activations; the backward pass adds one layer's activation
    gradients and, with any layer checkpointed, one layer's recomputed activations."""
    layer = layer_activation_bytes(shape, dtype_bytes)
    kept = (shape.layers - checkpointed_layers) * layer
    kept += checkpointed_layers * CHECKPOINTED_LAYER_BYTES_PER_HIDDEN * shape.hidden
    return kept + layer + (layer if checkpointed_layers else 0)


@dataclass(frozen=True)
class TrainingPass:
    """How a forward/backward pass runs: its tokens and how many decoder layers recompute their activations."""

    tokens: int
    checkpointed_layers: int


def plan_training_pass(free_bytes: int, shape: ModelShape, cap: int, *, dtype_bytes: int, checkpointing: bool,
                       selective: bool = False) -> TrainingPass:
    """Tokens per training pass and checkpointed layers within ``HEADROOM`` of ``free_bytes`` (what the pass's
    activations may use). Without ``checkpointing`` no layer is checkpointed; with it, every layer, or with
    ``selective`` the fewest layers that let a pass of ``cap`` tokens fit (none when the memory holds every layer's
    activations: recomputing a layer costs a third of its forward and backward). Tokens are ``cap`` when they fit,
    else as many as do (at least 1) with every layer checkpointed. The log-prob head runs in chunks of its own size,
    so its logits are not counted per token."""
    budget = int(free_bytes * HEADROOM)
    layers = shape.layers if checkpointing else 0
    if checkpointing and selective:
        layers = next((k for k in range(shape.layers + 1) if cap * training_bytes_per_token(
            shape, dtype_bytes=dtype_bytes, checkpointed_layers=k) <= budget), shape.layers)
    per_token = training_bytes_per_token(shape, dtype_bytes=dtype_bytes, checkpointed_layers=layers)
    return TrainingPass(max(1, min(cap, budget // per_token)), layers)


# torchao's AdamW8bit (as bitsandbytes) quantises the moments of a parameter of at least this many values whose count
# is a multiple of the block: uint8 codes and one float32 scale per block of 256 values; smaller ones keep fp32 moments.
EIGHT_BIT_MIN_VALUES = 4096
EIGHT_BIT_BLOCK = 256


def adam_state_bytes(numel: int, element_size: int, *, eight_bit: bool) -> int:
    """Bytes of AdamW's two moments of a parameter of ``numel`` values of ``element_size`` bytes: two copies in the
    parameter's dtype, or with ``eight_bit`` (``train.optimizer: adamw_8bit``) one byte per value and a float32 scale
    per block each (2 + 8/256 bytes per value; the shared 256-entry quantisation maps not counted)."""
    if eight_bit and numel >= EIGHT_BIT_MIN_VALUES and numel % EIGHT_BIT_BLOCK == 0:
        return eight_bit_moment_bytes(numel)
    return 2 * numel * element_size


def eight_bit_moment_bytes(values: int) -> int:
    """Bytes of two block-wise 8-bit moments of ``values`` values: one uint8 code each and a float32 scale per block."""
    return 2 * (values + 4 * (values // EIGHT_BIT_BLOCK))


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


# The fewest tokens a training pass should take for the plan of the training state to count it as fitting (every layer
# checkpointed): below this, the update runs but mostly as per-pass overhead.
MIN_PASS_TOKENS = 2048


@dataclass(frozen=True)
class StatePlan:
    """How a run keeps its roles' training state on one device: the idle role in host memory
    (``train.offload_idle_role``), 8-bit AdamW moments (``train.optimizer: adamw_8bit``), LoRA adapters instead of
    every weight; with the device bytes that needs and the bytes the plan may fill."""

    offload_idle_role: bool
    optimizer: Literal["adamw", "adamw_8bit"]
    lora: bool
    needed_bytes: int
    budget_bytes: int

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.budget_bytes

    def describe(self) -> str:
        """The plan in plain words, for the run's log."""
        steps = [what for on, what in ((self.offload_idle_role, "the idle role waits in host memory"),
                                       (self.optimizer == "adamw_8bit", "8-bit AdamW moments"),
                                       (self.lora, "LoRA adapters instead of every weight")) if on]
        verdict = "fits" if self.fits else "does NOT fit (the run may run out of memory)"
        return (f"{'; '.join(steps) or 'every role resident with fp32 AdamW, nothing changed'}: "
                f"{self.needed_bytes / 2**30:.1f} GiB of training state and working memory, {verdict} in "
                f"{self.budget_bytes / 2**30:.1f} GiB ({HEADROOM:.0%} of the usable memory)")


def role_state_bytes(parameters: int, trained: int, *, eight_bit: bool, bf16: bool, sampler_copy: bool,
                     reference: bool) -> int:
    """Device bytes one resident role holds between passes: its fp32 weights (and a frozen fp32 KL ``reference``), the
    gradients and AdamW moments of its ``trained`` parameters (8 bytes each, or with ``eight_bit`` 2 + 8/256 as if
    every tensor were quantised: :func:`adam_state_bytes`), under ``bf16`` autocast's bf16 copies of them, and with
    ``sampler_copy`` the sampler's bf16 copy of every weight."""
    weights = 4 * parameters * (2 if reference else 1)
    moments = eight_bit_moment_bytes(trained) if eight_bit else 8 * trained
    update = 4 * trained + moments + (2 * trained if bf16 else 0)
    return weights + update + (2 * parameters if sampler_copy else 0)


def plan_training_state(usable_bytes: int, shape: ModelShape, parameters: int, models: int, *, workspace_bytes: int,
                        bf16: bool, sampler_copy: bool, reference: bool, offload: bool | None,
                        optimizer: Literal["adamw", "adamw_8bit"] | None, lora: bool | None,
                        lora_rank: int = 8) -> StatePlan:
    """What ``models`` trained models of ``parameters`` each (``shape``) need to train on a device whose process may
    use ``usable_bytes``: the first of these that fits within ``HEADROOM`` of it, in order of what they change
    (offloading changes only time; 8-bit moments round the update; LoRA changes what is trained): nothing, the idle
    role offloaded, 8-bit moments, both, then LoRA (rank ``lora_rank`` on every linear layer) alone, with offloading,
    with 8-bit moments, with both. ``offload``, ``optimizer`` and ``lora`` are the user's settings: a value is kept
    as set, None is the plan's to choose (``lora`` None: LoRA allowed, ``train.lora_if_needed``). When nothing fits,
    the option that needs least, with ``fits`` false. Each option needs its resident roles' state
    (:func:`role_state_bytes`; one role when offloaded) and ``workspace_bytes`` (the log-prob head's chunk and a pass
    of ``MIN_PASS_TOKENS`` with every layer checkpointed: :func:`training_workspace_bytes`)."""
    budget = int(usable_bytes * HEADROOM)
    options = []
    for bits in range(8):
        off, eight, adapters = bool(bits & 1), bool(bits & 2), bool(bits & 4)
        if offload is None and off and models == 1:  # one model: nothing to offload
            continue
        if (offload is not None and off != offload) or (lora is not None and adapters != lora) \
                or (optimizer is not None and eight != (optimizer == "adamw_8bit")):
            continue
        trained = shape.lora_parameters(lora_rank) if adapters else parameters
        resident = 1 if off and models > 1 else models
        needed = resident * role_state_bytes(parameters, trained, eight_bit=eight, bf16=bf16,
                                             sampler_copy=sampler_copy, reference=reference and not adapters)
        options.append(StatePlan(off, "adamw_8bit" if eight else "adamw", adapters, needed + workspace_bytes, budget))
    return next((option for option in options if option.fits), min(options, key=lambda option: option.needed_bytes))


def training_workspace_bytes(shape: ModelShape, *, dtype_bytes: int, head_bytes: int) -> int:
    """Device bytes an update works in beside the training state: the log-prob head's ``head_bytes`` and a pass of
    ``MIN_PASS_TOKENS`` with every layer checkpointed (:func:`training_bytes_per_token`)."""
    return head_bytes + MIN_PASS_TOKENS * training_bytes_per_token(shape, dtype_bytes=dtype_bytes,
                                                                   checkpointed_layers=shape.layers)
