"""The HF engine's sampler copy and static decoder: the same samples as the plain loop, bf16 log-probs the trainer
can correct for, weights that follow the trainer, and (on CUDA) graphs that replay the same steps."""

from __future__ import annotations

import re

import pytest
import torch

from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine


def gqa_llama(tokenizer):
    """A random 2-layer Llama with grouped KV heads (4 query heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from coevolve.models.tiny_arith import build_tokenizer

    tok = build_tokenizer()
    tok.padding_side = "left"
    return tok


# 50 distinct prompts of different lengths and one prompt 30 times: batches of 64 and 16 rows, groups sharing a prompt.
PROMPTS = [f"Q:{i}+{i * 37}=?" for i in range(50)] + ["Q:1+1=?"] * 30


def test_static_decoder_greedy_equals_the_plain_loop(tokenizer):
    """Greedy: the same tokens, finish reasons and log-probs as the plain loop."""
    model = gqa_llama(tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    plain = HFRolloutEngine(model, tokenizer, batch_size=64).generate(PROMPTS, params, seed=3)
    static = HFRolloutEngine(model, tokenizer, batch_size=64, dtype=torch.float32, sync_every=4)
    got = static.generate(PROMPTS, params, seed=3)
    assert static.decoder is not None  # the static decoder ran, not the plain loop
    assert [c.token_ids for c in got] == [c.token_ids for c in plain]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in plain]
    for mine, theirs in zip(got, plain):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, max_new_tokens=60),
    SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=60, stop=("7",)),
], ids=["plain", "truncated-with-stop"])
def test_static_decoder_samples_exact_logprobs_and_ends_rows_by_the_plain_rules(tokenizer, params):
    """Sampling: each token's log-prob is the temperature-scaled model's (recomputed by the trainer), rows end by
    EOS, stop strings or the length as the plain loop decides them, and neither the host-check cadence nor the
    batch-size buckets change a sample."""
    from coevolve.rl.trainer import TrainSample, sequence_logprobs

    model = gqa_llama(tokenizer)
    runs = [HFRolloutEngine(model, tokenizer, batch_size=64, dtype=torch.float32, sync_every=every).generate(
        PROMPTS, params, seed=3) for every in (1, 4, 16)]
    got = runs[0]
    assert all([c.token_ids for c in run] == [c.token_ids for c in got] for run in runs[1:])
    assert len({len(c.token_ids) for c in got}) > 20  # rows ended at different steps
    assert {c.finish_reason for c in got} >= {"eos", "length"}
    for c in got:
        if c.finish_reason == "eos":
            assert c.token_ids[-1] == tokenizer.eos_token_id
        elif c.finish_reason == "stop":
            assert any(s in tokenizer.decode(c.token_ids[-16:]) for s in params.stop)
            assert not any(s in tokenizer.decode(c.token_ids[max(0, n - 16):n]) for s in params.stop
                           for n in range(1, len(c.token_ids)))
        else:
            assert len(c.token_ids) == params.max_new_tokens
    if params.stop:
        assert any(c.finish_reason == "stop" for c in got)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 0.0) for c in got]
    with torch.no_grad():
        recomputed, _ = sequence_logprobs(model, samples, tokenizer.pad_token_id, params.temperature)
    width = recomputed.shape[1]
    for i, c in enumerate(got):
        assert c.logprobs == pytest.approx(recomputed[i, width - len(c.logprobs):].tolist(), abs=1e-5)


def test_bf16_copy_logprobs_are_within_bf16_rounding_of_the_trainer_and_turn_tis_on(tokenizer):
    from coevolve.config import DEFAULT_TIS_CAP
    from coevolve.recipes import resolve
    from coevolve.rl.trainer import TrainSample, sequence_logprobs
    from coevolve.roles import tis_cap

    model = gqa_llama(tokenizer)
    engine = HFRolloutEngine(model, tokenizer, batch_size=16, dtype=torch.bfloat16)
    completions = engine.generate(PROMPTS[:16], SamplingParams(temperature=1.0, max_new_tokens=24), seed=0)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 0.0) for c in completions]
    with torch.no_grad():
        recomputed, mask = sequence_logprobs(model, samples, tokenizer.pad_token_id, temperature=1.0)
    width = recomputed.shape[1]
    gaps = torch.cat([(recomputed[i, width - len(c.logprobs):] - torch.tensor(c.logprobs)).abs()
                      for i, c in enumerate(completions)])
    assert next(engine.copy.model.parameters()).dtype == torch.bfloat16
    assert 0 < gaps.max() < 0.02 and gaps.mean() < 0.004, (gaps.max(), gaps.mean())  # bf16 rounding (0.0018, 4e-4)
    config, params, cls = resolve("grpo")
    constrained = cls.constrains_rollouts(params)
    assert tis_cap(config, bf16_sampler=True, constrained=constrained) == DEFAULT_TIS_CAP
    assert tis_cap(config, bf16_sampler=False, constrained=constrained) is None
    config, params, cls = resolve("grpo", sets=["train.tis_cap=5"])
    assert tis_cap(config, bf16_sampler=True, constrained=constrained) == 5.0  # an explicit cap wins


def test_the_copy_follows_the_trainers_updates_and_can_be_freed(tokenizer):
    model = gqa_llama(tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    published = [0]  # the weights version a trainer publishes (PolicyTrainer.weights_version)
    engine = HFRolloutEngine(model, tokenizer, batch_size=8, dtype=torch.float32, keep_sampler=True,
                             version=lambda: published[0])
    before = [c.token_ids for c in engine.generate(PROMPTS[:8], greedy, seed=0)]
    with torch.no_grad():  # an optimizer step writes the parameters in place
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    published[0] += 1  # ... and the trainer publishes the new weights
    after = [c.token_ids for c in engine.generate(PROMPTS[:8], greedy, seed=0)]
    plain = [c.token_ids for c in HFRolloutEngine(model, tokenizer, batch_size=8).generate(PROMPTS[:8], greedy, 0)]
    assert after == plain and after != before
    assert engine.pop_metrics()["rollout/weight_syncs"] == 2.0  # built once, reloaded once
    assert engine.pop_metrics()["rollout/weight_syncs"] == 0.0
    engine.keep_sampler = False
    engine.generate(PROMPTS[:8], greedy, seed=0)
    assert engine.copy.model is None and engine.decoder is None


def test_a_lora_policy_is_sampled_with_its_adapters_merged(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(gqa_llama(tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                            init_lora_weights=False))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    plain = HFRolloutEngine(model, tokenizer, batch_size=8).generate(PROMPTS[:8], greedy, seed=0)
    copied = HFRolloutEngine(model, tokenizer, batch_size=8, dtype=torch.float32).generate(PROMPTS[:8], greedy, 0)
    base = HFRolloutEngine(model.get_base_model(), tokenizer, batch_size=8)
    with model.disable_adapter():
        without = base.generate(PROMPTS[:8], greedy, seed=0)
    assert [c.token_ids for c in copied] == [c.token_ids for c in plain]
    assert [c.token_ids for c in copied] != [c.token_ids for c in without]
    assert not any("lora_" in name for name, _ in HFRolloutEngine(
        model, tokenizer, dtype=torch.float32).copy.current().named_parameters())


def test_a_regex_constraint_still_masks_with_a_bf16_sampler(tokenizer):
    pytest.importorskip("xgrammar")
    engine = HFRolloutEngine(gqa_llama(tokenizer), tokenizer, batch_size=8, dtype=torch.bfloat16)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, regex=r"[0-9]{3}")
    completions = engine.generate(PROMPTS[:8], params, seed=0)
    assert all(re.fullmatch(r"[0-9]{3}", c.text) for c in completions), [c.text for c in completions]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the decoding step is captured as a CUDA graph")
def test_cuda_graphs_replay_the_same_steps_as_the_uncaptured_decoder(tokenizer):
    model = gqa_llama(tokenizer).cuda()
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=60, stop=("7",))
    runs = {}
    for graphs in (False, True):
        engine = HFRolloutEngine(model, tokenizer, batch_size=64, dtype=torch.bfloat16, cuda_graphs=graphs)
        runs[graphs] = engine.generate(PROMPTS, params, seed=3)
        assert bool(engine.decoder.captured) == graphs and engine.decoder.graph_failures == 0
    assert [c.token_ids for c in runs[True]] == [c.token_ids for c in runs[False]]
    assert [c.finish_reason for c in runs[True]] == [c.finish_reason for c in runs[False]]
    for mine, theirs in zip(runs[True], runs[False]):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


@pytest.mark.parametrize("sync_every", [2, 4])
def test_a_stop_string_across_two_host_checks_ends_the_row_where_the_plain_loop_does(tokenizer, sync_every):
    """The first host check sees tokens 0..sync_every; a stop string whose first characters are its last tokens and
    whose rest comes in the next chunk (2 and 3 characters: one token each here) ends the row at the same token,
    with the same log-probs, as the plain loop that checks after every token."""
    model = gqa_llama(tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    plain_texts = [tokenizer.decode(c.token_ids) for c in
                   HFRolloutEngine(model, tokenizer, batch_size=64).generate(PROMPTS[:50], greedy, seed=0)]
    checked = 0
    for span in (2, 3):
        start = sync_every + 1 - (span - 1)  # the stop string's first token is in the first check's chunk
        for prompt, text in zip(PROMPTS[:50], plain_texts):
            stop = text[start:start + span]
            if len(stop) < span or stop in text[:start + span - 1] or tokenizer.eos_token in stop:
                continue  # it must complete exactly at token start + span - 1, the second chunk's first token
            params = SamplingParams(temperature=0.0, max_new_tokens=12, stop=(stop,))
            plain = HFRolloutEngine(model, tokenizer, batch_size=64).generate([prompt], params, seed=0)[0]
            static_engine = HFRolloutEngine(model, tokenizer, batch_size=64, dtype=torch.float32,
                                            sync_every=sync_every)
            static = static_engine.generate([prompt], params, seed=0)[0]
            assert static_engine.decoder is not None
            assert plain.finish_reason == static.finish_reason == "stop"
            assert len(plain.token_ids) == start + span  # ends on the token that completes the stop string
            assert static.token_ids == plain.token_ids
            assert static.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
            checked += 1
            break
    assert checked == 2  # both spans found a prompt whose greedy text puts the stop string across the boundary
