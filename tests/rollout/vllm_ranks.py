"""vLLM engines in the ranks of a torchrun job, driven as a recipe drives them (tests/rollout/test_vllm_processes.py).

``torchrun --nproc-per-node 2 vllm_ranks.py MODEL_DIR OUT_JSON TENSOR_PARALLEL``: one policy trained data-parallel
(DDP), one with LoRA adapters, one sharded with FSDP2, each with its vLLM engine built by ``make_engine`` as a recipe
builds it.
For each: the samples of a seeded call (each engine sampled its share) and those of this rank's own engine sampling the
whole call; one update; then every rank's own engine samples all prompts again and the largest gap between its
log-probs and the trainer's recomputation is gathered, with how far the update moved the log-probs of the first
samples. Also: the parameters each rank's engine holds, and the most gathered tensors of the sharded model alive at
once while its engine loads them. Rank 0 writes the results as JSON.
"""

from __future__ import annotations

import gc
import json
import sys
import weakref

import torch

from coevolve import distributed
from coevolve.config import SamplingConfig
from coevolve.models import load_policy
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, sequence_logprobs
from coevolve.rollout import SamplingParams, make_engine, vllm_engine
from coevolve.rollout.weights import hf_state_dict

PROMPTS = ["Q:3+4=?\n", "Q:12*3-4=?\n", "Q:7-2*3=?\n", "W:", "Q:5*5=?\n", "Q:9-1=?\n", "Q:2+2*2=?\n"]
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=16)

most_alive = {"count": 0}  # full tensors of a sharded model held at once while an engine loads them


def counting_state_dict(model: torch.nn.Module):
    """``hf_state_dict`` that records how many of the tensors it yielded are still alive at each yield."""
    alive: list[weakref.ref] = []
    for name, tensor in hf_state_dict(model):
        alive = [ref for ref in alive if ref() is not None]
        alive.append(weakref.ref(tensor))
        most_alive["count"] = max(most_alive["count"], len(alive))
        yield name, tensor
        del tensor


def check(model_dir: str, tensor_parallel: int, fsdp: bool = False, lora: dict | None = None) -> dict:
    policy = load_policy(model_dir)
    trainer = PolicyTrainer(policy.model, policy.tokenizer,
                            UpdateSettings(lr=3e-2, micro_batch_size=4, fsdp=fsdp, lora=lora))
    policy.model = trainer.model  # as Recipe.make_trainer does: LoRA wraps the model
    rollout = SamplingConfig(engine="vllm", vllm={"kv_cache_gib": 0.05, "tensor_parallel_size": tensor_parallel})
    engine = make_engine(policy, rollout, version=lambda: trainer.weights_version,
                         data_parallel=True, sharded=trainer.model if fsdp else None)
    own = engine.inner  # this rank's engine, without the data-parallel wrapper
    shares = engine.generate(PROMPTS, SAMPLING, seed=11)
    whole = own.generate(PROMPTS, SAMPLING, seed=11)
    trainer.update([TrainSample(c.prompt_ids, c.token_ids, c.logprobs, (-1.0) ** i) for i, c in enumerate(shares)])
    after = own.generate(PROMPTS, SAMPLING, seed=12)
    with torch.no_grad(), distributed.full_weights(trainer.model):
        gap, moved = largest_gap(trainer.model, policy, after), largest_gap(trainer.model, policy, shares)
    return {"shares": [c.token_ids for c in shares], "whole": [c.token_ids for c in whole], "moved": moved,
            "gaps": distributed.all_gather_objects(gap),
            "syncs": distributed.all_gather_objects(engine.pop_metrics()["rollout/weight_syncs"]),
            "engine_parameters": distributed.all_gather_objects(own.llm.collective_rpc(engine_parameters)[0])}


def largest_gap(model: torch.nn.Module, policy, completions) -> float:
    """The largest |sampler's log-prob - the model's| over the completions' tokens."""
    gaps = []
    for c in completions:
        if not c.token_ids:  # EOS first
            continue
        sample = TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 0.0)
        logprobs = sequence_logprobs(model, [sample], policy.tokenizer.pad_token_id, SAMPLING.temperature)[0][0]
        gaps.append(float((torch.tensor(c.logprobs) - logprobs).abs().max()))
    return max(gaps)


def engine_parameters(worker) -> int:
    """Runs in the engine's worker: how many parameter values this rank's engine holds."""
    return sum(p.numel() for p in worker.model_runner.get_model().parameters())


def main(model_dir: str, out: str, tensor_parallel: int) -> None:
    torch.set_num_threads(1)
    distributed.init_from_env(torch.device("cpu"))
    vllm_engine.hf_state_dict = counting_state_dict
    results = {"ddp": check(model_dir, tensor_parallel)}
    gc.collect()  # the first engine is garbage now: the run's process group must outlive it (vllm_engine keeps it)
    results["lora"] = check(model_dir, tensor_parallel, lora={"r": 4, "lora_alpha": 8,
                                                              "target_modules": ["q_proj", "v_proj"]})
    gc.collect()
    most_alive["count"] = 0  # the plain model's tensors are the live weights, all alive
    results["fsdp"] = check(model_dir, tensor_parallel, fsdp=True)
    names = list(load_policy(model_dir).model.state_dict())
    results["fsdp"].update(most_alive=max(distributed.all_gather_objects(most_alive["count"])), tensors=len(names),
                           layer_tensors=sum(name.startswith("model.layers.0.") for name in names))
    if distributed.is_main():
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
