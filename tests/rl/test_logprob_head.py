"""The chunked log-prob head (coevolve.rl.logprob_head) gives the plain head's log-probs and gradients: packed and
padded micro-batches, several chunks, a temperature, tied embeddings, bf16 autocast and LoRA; a model it does not
recognise, or a pass whose logits fit one chunk, keeps the plain path."""

from __future__ import annotations

import pytest
import torch
from helpers import random_samples

from coevolve.rl import logprob_head
from coevolve.rl import trainer as trainer_module
from coevolve.rl.trainer import TrainSample, completion_logprobs, sequence_logprobs

VOCAB = 300


def _qwen2(tied: bool = True):
    """A random 2-layer Qwen2 (q/k/v biases), by default with tied embeddings as Qwen2.5's small models."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied))


def _tiny_arith(small_tiny_arith):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(small_tiny_arith[1])


def _samples(vocab: int) -> list[TrainSample]:
    """Three prompts, six completions of different lengths: some share a prompt."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    return random_samples(prompts, (5, 1, 9, 3, 7, 2), tokens=(3, vocab), seed=2)


def _logprobs_and_grads(model, samples, monkeypatch, *, chunk_logits: int, packed: bool,
                        bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked log-probs of the samples (temperature 0.7) and the gradient of a weighted sum of them."""
    monkeypatch.setattr(logprob_head, "HEAD_CHUNK_LOGITS", chunk_logits)
    monkeypatch.setattr(trainer_module, "packs", lambda model, samples: packed)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logprobs, mask = sequence_logprobs(model, samples, 0, 0.7)
    (logprobs * mask * torch.linspace(-1, 1, logprobs.shape[1])).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return (logprobs * mask).detach(), grads


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("name", ["tiny-arith", "qwen2-tied"])
def test_chunked_head_equals_the_plain_head(name, packed, small_tiny_arith, monkeypatch):
    model = _tiny_arith(small_tiny_arith) if name == "tiny-arith" else _qwen2()
    vocab = model.config.vocab_size
    assert logprob_head.split_model(model, logprob_head.HEAD_CHUNK_LOGITS) is not None
    samples = _samples(vocab)
    plain = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=0, packed=packed)
    chunked = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=4 * vocab, packed=packed)  # 4 tokens
    assert torch.allclose(chunked[0], plain[0], atol=1e-5)
    assert torch.allclose(chunked[1], plain[1], atol=1e-5)


def test_chunked_head_under_bf16_autocast_matches_the_plain_head(monkeypatch):
    model, samples = _qwen2(), _samples(VOCAB)
    reference = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=0, packed=True)
    plain = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=0, packed=True, bf16=True)
    chunked = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=4 * VOCAB, packed=True, bf16=True)
    assert torch.equal(chunked[0], plain[0])  # the same bf16 matmul and fp32 log-sum-exp per token
    distance = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    # the weight gradient is summed over chunks of bf16 products: as close to fp32 as the plain head's
    assert distance(chunked[1], plain[1]) < 5e-3
    assert distance(chunked[1], reference[1]) < 1.2 * distance(plain[1], reference[1])


def test_lora_trains_through_the_chunked_head_and_a_lora_head_keeps_the_plain_path(monkeypatch):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_qwen2(), LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8,
                                                target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert logprob_head.split_model(model, logprob_head.HEAD_CHUNK_LOGITS).head is model.get_base_model().lm_head
    samples = _samples(VOCAB)
    plain = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=0, packed=False)
    chunked = _logprobs_and_grads(model, samples, monkeypatch, chunk_logits=4 * VOCAB, packed=False)
    assert torch.allclose(chunked[0], plain[0], atol=1e-5) and torch.allclose(chunked[1], plain[1], atol=1e-5)
    lora_head = get_peft_model(_qwen2(tied=False), LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["lm_head"]))
    assert logprob_head.split_model(lora_head, logprob_head.HEAD_CHUNK_LOGITS) is None


def test_unrecognised_models_small_passes_and_the_off_switch_keep_the_plain_head(monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2))
    assert logprob_head.split_model(gpt2, logprob_head.HEAD_CHUNK_LOGITS) is None
    model = _qwen2()
    one_chunk = logprob_head.HEAD_CHUNK_LOGITS // VOCAB  # the whole logits fit one chunk: computed whole
    assert logprob_head.split_model(model, one_chunk) is None and logprob_head.split_model(model, one_chunk + 1)
    monkeypatch.setattr(logprob_head, "HEAD_CHUNK_LOGITS", 0)
    assert logprob_head.split_model(model, 1 << 40) is None


def test_gpu_passes_default_to_a_token_budget_only_where_the_head_runs_in_chunks(random_policy):
    """Unset ``train.micro_batch_tokens``: GPU_MICRO_BATCH_TOKENS on a GPU for a model the chunked head covers; on a
    CPU, for other architectures and when the key is set, what the config says (None: micro_batch_size)."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    from coevolve.config import GPU_MICRO_BATCH_TOKENS
    from coevolve.recipes import resolve
    from coevolve.roles import RoleRuntime

    def budget(sets: list[str], model, on_cuda: bool) -> int | None:
        return RoleRuntime(resolve("grpo", sets=sets)[0])._micro_batch_tokens(SimpleNamespace(model=model), on_cuda)

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert budget([], random_policy.model, on_cuda=True) == GPU_MICRO_BATCH_TOKENS
    assert budget([], random_policy.model, on_cuda=False) is None
    assert budget([], gpt2, on_cuda=True) is None
    assert budget(["train.micro_batch_tokens=512"], random_policy.model, on_cuda=True) == 512


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_chunked_entropy_equals_the_plain_heads_entropy_and_its_gradient(packed, monkeypatch):
    """train.entropy_coef's entropies (temperature 0.7) through 4-token chunks: the plain head's values, and the
    gradient of a weighted sum of log-probs and entropies is the plain head's."""
    monkeypatch.setattr(trainer_module, "packs", lambda model, samples: packed)
    model, samples = _qwen2(), _samples(VOCAB)

    def run(chunk_logits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(logprob_head, "HEAD_CHUNK_LOGITS", chunk_logits)
        model.zero_grad(set_to_none=True)
        logprobs, mask, entropy = completion_logprobs(model, samples, 0, 0.7, entropy=True)
        weights = torch.linspace(-1, 1, logprobs.shape[1])
        ((logprobs * weights + entropy * weights.flip(0)) * mask).sum().backward()
        return (logprobs * mask).detach(), (entropy * mask).detach(), torch.cat([p.grad.flatten()
                                                                               for p in model.parameters()])

    plain, chunked = run(0), run(4 * VOCAB)
    assert float(plain[1].max()) > 1.0  # near-uniform over 300 entries: up to log 300 = 5.7
    for a, b in zip(chunked, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    logprobs_only = completion_logprobs(model, samples, 0, 0.7, entropy=False)
    assert logprobs_only[2] is None and torch.equal(logprobs_only[0] * logprobs_only[1], chunked[0])
