"""``train.compile``: every decoder layer compiled in place, the same log-probs and gradients, other lengths reused.

The suite compiles with torch's ``eager`` backend (Dynamo's graph capture without code generation, seconds on CPU);
``bench/gpu.py`` measures the inductor backend on a GPU.
"""

from __future__ import annotations

import copy

import torch
from helpers import random_samples

from coevolve.rl.compiled_layers import compile_decoder_layers, decoder_layers
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, sequence_logprobs


def _samples(tokenizer, lengths: list[int]) -> list[TrainSample]:
    return random_samples([tokenizer(f"Q:{i}+{i}=?")["input_ids"] for i in range(len(lengths))], lengths)


def test_compiled_layers_give_the_plain_log_probs_and_gradients_under_checkpointing(random_policy):
    plain = random_policy.model.train()
    plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = copy.deepcopy(plain)
    assert compile_decoder_layers(compiled, backend="eager") == plain.config.num_hidden_layers
    tok = random_policy.tokenizer
    for lengths in ([3, 7, 9, 4], [12, 5]):  # a second shape: marked dynamic, no error and the same values
        results = []
        for model in (plain, compiled):
            model.zero_grad(set_to_none=True)
            logprobs, mask = sequence_logprobs(model, _samples(tok, lengths), tok.pad_token_id, 1.0)
            (logprobs * mask).sum().backward()
            results.append((logprobs.detach(), [p.grad.clone() for p in model.parameters()]))
        assert torch.equal(results[0][0], results[1][0])
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0][1], results[1][1]))


def test_the_setting_compiles_each_layer_of_the_trained_model(random_policy):
    trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer, UpdateSettings(compile=True))
    assert all(layer._compiled_call_impl is not None for layer in decoder_layers(trainer.model))
    untouched = PolicyTrainer(copy.deepcopy(random_policy.model), random_policy.tokenizer, UpdateSettings())
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(untouched.model))
