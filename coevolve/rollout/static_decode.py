"""The decoding loop for a GPU: static buffers, batch-size buckets and one CUDA graph per bucket.

The HF engine's token loop asks the host after every token which rows finished and launches a few hundred small
kernels per step; on a GPU that costs more than the model's own work. Here one decoding step (the forward pass of the
batch's newest tokens into a preallocated KV cache, then temperature, top-k/top-p, the draw and the log-prob) reads and
writes only tensors that live for the whole call, so it can be captured once as a CUDA graph and replayed. A step
records each row's token and log-prob and marks rows that sampled EOS on the device; the host looks every
``sync_every`` tokens, to stop when every row finished, to apply stop strings, and to move the rows still generating
to the front and continue in the next smaller batch-size bucket (each bucket has its own graph over the first rows of
the same buffers), so the work follows the rows still generating.

Decode attention reads each key/value head once for its group of query heads (no copy per query head, as the
stock SDPA path makes whenever a mask is passed). Models with sliding-window layers or without a KV-head layout this
loop knows are not supported (:func:`supports`); the engine then uses its plain loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from coevolve.padding import left_pad, position_ids_from_mask
from coevolve.rollout.base import SamplingParams, distinct_prompts

DECODE_ATTENTION = "coevolve_decode"
BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
SLOT_ROUNDING = 128  # cache lengths are rounded up to this, so calls with similar prompt lengths share graphs


def grouped_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of one new token per row against the cache, each KV head read once for its query heads.

    Longer queries (the prefill) go to SDPA. ``attention_mask`` is additive, [B, 1, 1, slots].
    """
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * (scaling or dim ** -0.5)
    weights = (scores + attention_mask.float()).softmax(-1).to(value.dtype)
    return torch.matmul(weights, value).view(rows, 1, heads, dim), None


AttentionInterface.register(DECODE_ATTENTION, grouped_decode_attention)


def supports(model) -> bool:
    """Whether :class:`StaticDecoder` can run ``model``: full attention in every layer and a standard KV layout."""
    config = model.config
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (layer_types == {"full_attention"} and not getattr(config, "use_sliding_window", False)
            and hasattr(config, "num_hidden_layers") and hasattr(config, "num_attention_heads"))


class StaticKVCache:
    """Keys and values of every layer in preallocated [rows, kv_heads, slots, head_dim] tensors.

    ``update`` (what a transformers attention layer calls) writes the new keys/values at the slots ``write_at`` and
    returns the whole cache; masking decides which slots count. ``rows(n)`` is a cache over the first n rows of the
    same storage.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], write_at: torch.Tensor):
        self.keys, self.values, self.write_at = keys, values, write_at

    @classmethod
    def allocate(cls, config, rows: int, slots: int, dtype: torch.dtype, device: torch.device) -> StaticKVCache:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (rows, kv_heads, slots, head_dim)
        layers = config.num_hidden_layers
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   torch.zeros(1, dtype=torch.long, device=device))

    def rows(self, n: int) -> StaticKVCache:
        return StaticKVCache([k[:n] for k in self.keys], [v[:n] for v in self.values], self.write_at)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.write_at, key_states)
        values.index_copy_(2, self.write_at, value_states)
        return keys, values

    def move_rows(self, keep: torch.Tensor) -> None:
        """Rows ``keep`` become rows 0..len(keep)-1, layer by layer (a temporary of one layer's rows at a time)."""
        n = len(keep)
        for tensor in (*self.keys, *self.values):
            tensor[:n] = tensor.index_select(0, keep)


def bucket_for(rows: int, largest: int) -> int:
    """The smallest batch-size bucket that holds ``rows`` (``largest``, the call's batch, is always a bucket)."""
    return next((b for b in BUCKETS if rows <= b < largest), largest)


@dataclass(frozen=True)
class Shape:
    """What a workspace's buffers are sized for: batch rows, cache slots, new tokens."""

    rows: int
    slots: int
    new_tokens: int


class StaticDecoder:
    """Preallocated decoding state for batches of one :class:`Shape` and the step captured per bucket.

    ``sample`` is the engine's sampling function (logits [B, V] float, params, uniforms [B]) -> (tokens, log-probs);
    the graph and the plain replay run the same step, so they sample the same tokens.
    """

    def __init__(self, model, shape: Shape, eos_token_ids: Sequence[int], sample: Callable, *, graphs: bool):
        device = next(model.parameters()).device
        self.model, self.shape, self.sample = model, shape, sample
        model.config._attn_implementation = DECODE_ATTENTION  # the engine's own copy of the weights
        self.graphs = graphs and device.type == "cuda"
        rows, slots, new = shape.rows, shape.slots, shape.new_tokens
        self.dtype = next(model.parameters()).dtype
        self.cache = StaticKVCache.allocate(model.config, rows, slots, self.dtype, device)
        self.views = {rows: self.cache}
        self.eos = torch.tensor(list(eos_token_ids) or [-1], dtype=torch.long, device=device)
        self.slot_ids = torch.arange(slots, device=device)
        # Per bucket row: the token fed next, its position, which prompt it is, whether it still generates, padding.
        self.token = torch.zeros(rows, dtype=torch.long, device=device)
        self.position = torch.zeros(rows, dtype=torch.long, device=device)
        self.prompt_row = torch.zeros(rows, dtype=torch.long, device=device)
        self.alive = torch.zeros(rows, dtype=torch.bool, device=device)
        self.padding = torch.zeros(rows, slots, dtype=torch.bool, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # index of the token sampled next
        # Per prompt (one extra row takes the writes of bucket rows that hold no prompt).
        self.out_tokens = torch.zeros(rows + 1, new, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(rows + 1, new, dtype=torch.float32, device=device)
        self.out_length = torch.zeros(rows + 1, dtype=torch.long, device=device)
        self.out_eos = torch.zeros(rows + 1, dtype=torch.bool, device=device)
        self.uniforms = torch.zeros(new, rows + 1, dtype=torch.float64, device=device)
        self.captured: dict[tuple[int, SamplingParams], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.graph_failures = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers this decoder holds (the KV cache and the per-token outputs)."""
        held = (*self.cache.keys, *self.cache.values, self.out_tokens, self.out_logprobs, self.uniforms, self.padding)
        return sum(t.numel() * t.element_size() for t in held)

    # --- one call ----------------------------------------------------------------------------------------------------
    def run(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator,
            pad_id: int, sync_every: int, stopped: Callable | None) -> tuple[list[list[int]], list[list[float]],
                                                                             list[int], list[str]]:
        """Sample ``params.max_new_tokens`` tokens for each prompt; returns tokens, log-probs, lengths, reasons.

        ``stopped(tokens, first)`` takes some rows' tokens so far and returns, per row, the index of the first token
        from ``first`` on that completes a stop string (or None).
        """
        batch, new = len(prompt_ids), params.max_new_tokens
        self.uniforms[:, :batch] = torch.rand(new, batch, generator=generator, dtype=torch.float64,
                                              device=generator.device)
        self.out_length.fill_(new)
        self.out_eos.zero_()
        first_logits, prompt_width = self._prefill(prompt_ids, pad_id)
        rows = bucket_for(batch, self.shape.rows)
        self._clear(batch, rows)
        self.step.zero_()
        self._sample_into(first_logits, batch, params)
        self.position[:batch] += 1
        self.step += 1
        self.cache.write_at.fill_(prompt_width)
        reasons: dict[int, str] = {}
        t = 1
        while t < new:
            chunk = min(sync_every, new - t)
            alive_before = self.alive[:rows].clone()
            for _ in range(chunk):
                self._advance(rows, params)
            t += chunk
            if stopped is not None:
                self._apply_stops(alive_before, t - chunk, t, stopped, reasons)
            alive = int(self.alive[:rows].sum())
            if alive == 0:
                break
            bucket = bucket_for(alive, self.shape.rows)
            if bucket < rows:
                rows = self._compact(rows, bucket)
        lengths = self.out_length[:batch].tolist()
        eos = self.out_eos[:batch].tolist()
        tokens, logprobs = self.out_tokens[:batch].tolist(), self.out_logprobs[:batch].tolist()
        finish = [reasons.get(i, "eos" if eos[i] else "length") for i in range(batch)]
        return ([tokens[i][:lengths[i]] for i in range(batch)], [logprobs[i][:lengths[i]] for i in range(batch)],
                lengths, finish)

    def _prefill(self, prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, int]:
        """Run each distinct prompt once into a small cache, copy it to every row; returns the next-token logits."""
        device = self.slot_ids.device
        batch = len(prompt_ids)
        distinct, expand = distinct_prompts(prompt_ids, device)
        ids, attention = left_pad(distinct, pad_id)
        ids, attention = ids.to(device), attention.to(device)
        width, real, positions = ids.shape[1], attention.bool(), position_ids_from_mask(attention)
        visible = torch.ones(width, width, dtype=torch.bool, device=device).tril() & real[:, None, :]
        mask = self._additive(visible[:, None])
        prefill = StaticKVCache.allocate(self.model.config, len(distinct), width, self.dtype, device)
        prefill.write_at = torch.arange(width, device=device)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=prefill,
                            use_cache=True, logits_to_keep=1).logits[:, -1, :]
        for mine, theirs in zip((*self.cache.keys, *self.cache.values), (*prefill.keys, *prefill.values)):
            mine[:batch, :, :width] = theirs.index_select(0, expand)
        self.padding[:batch] = True
        self.padding[:batch, :width] = ~real[expand]
        self.padding[:batch, width:] = False
        self.position[:batch] = positions[expand, -1]
        self.prompt_row[:batch] = torch.arange(batch, device=device)
        self.alive[:batch] = True
        return logits[expand], width

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """An additive mask in the model's dtype: 0 where visible, the dtype's lowest value elsewhere (not -inf, so
        a row that sees nothing stays finite)."""
        return torch.zeros(visible.shape, dtype=self.dtype, device=visible.device).masked_fill_(
            ~visible, torch.finfo(self.dtype).min)

    # --- the step ----------------------------------------------------------------------------------------------------
    def _decode_step(self, rows: int, params: SamplingParams) -> None:
        """Feed each row's newest token, sample the next, record it; every tensor here lives for the whole call."""
        visible = (self.slot_ids <= self.cache.write_at) & ~self.padding[:rows]
        logits = self.model(input_ids=self.token[:rows, None], attention_mask=self._additive(visible[:, None, None]),
                            position_ids=self.position[:rows, None], past_key_values=self._view(rows),
                            use_cache=True).logits[:, -1, :]
        self._sample_into(logits, rows, params)
        self.position[:rows] += 1
        self.cache.write_at += 1
        self.step += 1

    def _sample_into(self, logits: torch.Tensor, rows: int, params: SamplingParams) -> None:
        prompt = self.prompt_row[:rows]
        uniforms = self.uniforms.index_select(0, self.step)[0, prompt]
        chosen, logprob = self.sample(logits.float(), params, uniforms)
        at = (prompt, self.step.expand(rows))
        self.out_tokens.index_put_(at, chosen)
        self.out_logprobs.index_put_(at, logprob.float())
        ended = self.alive[:rows] & (chosen[:, None] == self.eos).any(-1)  # isin may sort: not capturable
        self.out_length.index_put_((prompt,), torch.where(ended, self.step + 1, self.out_length[prompt]))
        self.out_eos.index_put_((prompt,), self.out_eos[prompt] | ended)
        self.alive[:rows] &= ~ended
        self.token[:rows] = chosen

    def _view(self, rows: int) -> StaticKVCache:
        if rows not in self.views:
            self.views[rows] = self.cache.rows(rows)
        return self.views[rows]

    def _advance(self, rows: int, params: SamplingParams) -> None:
        """One step in bucket ``rows``: replay its graph (capturing it on first use) or run it as it is."""
        key = (rows, params)
        if self.graphs and key not in self.captured:
            self._capture(rows, params)
        if key in self.captured:
            self.captured[key].replay()
        else:
            self._decode_step(rows, params)

    def _capture(self, rows: int, params: SamplingParams) -> None:
        """Capture the step for bucket ``rows``; warm-up runs on a side stream and its state changes are undone."""
        state = [t.clone() for t in (self.token, self.position, self.alive, self.step, self.cache.write_at,
                                     self.out_length, self.out_eos)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._decode_step(rows, params)
                    self._restore(state)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._decode_step(rows, params)
            self._restore(state)
            self.captured[(rows, params)] = graph
        except RuntimeError:  # a model whose forward cannot be captured: this bucket runs without a graph
            torch.cuda.current_stream().wait_stream(stream)
            self._restore(state)
            self.graph_failures += 1
            self.graphs = self.graph_failures < 2

    def _restore(self, state: list[torch.Tensor]) -> None:
        for live, saved in zip((self.token, self.position, self.alive, self.step, self.cache.write_at,
                                self.out_length, self.out_eos), state):
            live.copy_(saved)

    # --- between steps -----------------------------------------------------------------------------------------------
    def _apply_stops(self, alive_before: torch.Tensor, first: int, last: int, stopped: Callable,
                     reasons: dict[int, str]) -> None:
        """End rows whose tokens ``first..last-1`` complete a stop string, unless they sampled EOS before it
        (``alive_before``: the bucket rows that were generating when these tokens were sampled)."""
        live = alive_before.nonzero()[:, 0]
        if len(live) == 0:
            return
        prompt = self.prompt_row[live]
        tokens = self.out_tokens[prompt, :last].tolist()
        lengths, eos = self.out_length[prompt].tolist(), self.out_eos[prompt].tolist()
        for slot, row, end, length, ended in zip(live.tolist(), prompt.tolist(), stopped(tokens, first), lengths, eos):
            if end is not None and (not ended or end + 1 < length):
                self.out_length[row] = end + 1
                self.out_eos[row] = False
                self.alive[slot] = False
                reasons[row] = "stop"

    def _compact(self, rows: int, bucket: int) -> int:
        """Move the rows still generating to the front and continue in ``bucket`` rows."""
        keep = self.alive[:rows].nonzero()[:, 0]
        n = len(keep)
        self.cache.move_rows(keep)
        for tensor in (self.token, self.position, self.prompt_row, self.alive, self.padding):
            tensor[:n] = tensor.index_select(0, keep)
        self._clear(n, bucket)
        return bucket

    def _clear(self, first: int, last: int) -> None:
        """Bucket rows ``first..last-1`` hold no prompt: they generate nothing and write to the spare output row."""
        self.prompt_row[first:last] = self.shape.rows
        self.alive[first:last] = False
        self.padding[first:last] = True
