"""The sampling engine and the trainer agree on log-probs; sampling is reproducible; updates move the model."""

from __future__ import annotations

import torch

from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, sequence_logprobs
from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine, truncate_logits

PROMPTS = ["Q:3+4=?\n", "Q:12*(3-5)+7=?\n", "W:\n", "D:a=3,b=7\nQ:a+b=?\n"]


def _engine(policy):
    return HFRolloutEngine(policy.model, policy.tokenizer, batch_size=3, eos_token_ids=policy.eos_token_ids)


def test_sampling_is_reproducible_and_batched(random_policy):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=12)
    first = _engine(random_policy).generate(PROMPTS, params, seed=7)
    again = _engine(random_policy).generate(PROMPTS, params, seed=7)
    other = _engine(random_policy).generate(PROMPTS, params, seed=8)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]
    for c in first:
        assert len(c.token_ids) == len(c.logprobs) <= 12
        assert c.finish_reason in ("eos", "stop", "length")
        assert c.text == random_policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_greedy_matches_unbatched_greedy(random_policy):
    """Left padding must not change what a prompt generates: batch of 4 == one at a time."""
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    together = _engine(random_policy).generate(PROMPTS, params, seed=0)
    alone = [_engine(random_policy).generate([p], params, seed=0)[0] for p in PROMPTS]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]


def test_trainer_logprobs_equal_sampling_logprobs(random_policy):
    params = SamplingParams(temperature=0.7, max_new_tokens=16)
    completions = _engine(random_policy).generate(PROMPTS * 2, params, seed=3)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 1.0) for c in completions]
    logprobs, mask = sequence_logprobs(random_policy.model, samples, random_policy.tokenizer.pad_token_id, 0.7)
    width = logprobs.shape[1]
    for row, c in enumerate(completions):
        got = logprobs[row, width - len(c.token_ids):]
        assert torch.allclose(got, torch.tensor(c.logprobs), atol=1e-4), (got, c.logprobs)
        assert mask[row].sum() == len(c.token_ids)


def test_stop_strings_end_a_completion(random_policy):
    # "\n" is one character token; with enough samples some completion contains it
    params = SamplingParams(temperature=1.5, max_new_tokens=24, stop=("\n",))
    completions = _engine(random_policy).generate(["Q:1+1=?\n"] * 16, params, seed=1)
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped, "no completion hit the stop string"
    for c in stopped:
        assert c.text.endswith("\n") and c.text.count("\n") == 1


def test_truncate_logits_keeps_top_k_and_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(truncate_logits(logits, 2, 1.0)[0, 2:]).all()
    kept = ~torch.isinf(truncate_logits(logits, 0, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 so the second token is needed


def test_update_raises_likelihood_of_positive_advantage(random_policy):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    completions = _engine(random_policy).generate(["Q:2+2=?\n"] * 4, params, seed=5)
    good, bad = completions[0], completions[1]
    samples = [TrainSample(good.prompt_ids, good.token_ids, good.logprobs, 1.0),
               TrainSample(bad.prompt_ids, bad.token_ids, bad.logprobs, -1.0)]
    trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer,
                            UpdateSettings(lr=1e-2, micro_batch_size=1, epochs=3, temperature=1.0))
    before, _ = sequence_logprobs(trainer.model, samples, trainer.pad_id, 1.0)
    stats = trainer.update(samples)
    after, _ = sequence_logprobs(trainer.model, samples, trainer.pad_id, 1.0)
    assert stats["optimizer_steps"] == 3 and stats["skipped_steps"] == 0
    width = before.shape[1]
    gain = lambda lp, c: float(lp[width - len(c.token_ids):].sum())  # noqa: E731
    assert gain(after[0], good) > gain(before[0], good)
    assert gain(after[1], bad) < gain(before[1], bad)


def test_nan_advantage_step_is_skipped(random_policy):
    completions = _engine(random_policy).generate(["Q:2+2=?\n"] * 2, SamplingParams(max_new_tokens=6), seed=5)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, float("nan")) for c in completions]
    trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer, UpdateSettings(lr=1e-2))
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.update(samples)
    assert stats["skipped_steps"] == 1 and stats["optimizer_steps"] == 0
    assert all(torch.equal(w, p) for w, p in zip(weights, trainer.model.parameters()))


def test_kl_reference_and_lora(random_policy):
    from coevolve.models import Policy

    completions = _engine(random_policy).generate(PROMPTS, SamplingParams(max_new_tokens=6), seed=2)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, a) for c, a in zip(completions, [1, -1, 1, -1])]
    trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer,
                            UpdateSettings(lr=1e-2, kl_beta=0.1, lora={"r": 4, "lora_alpha": 8,
                                                                       "target_modules": ["q_proj", "v_proj"]}))
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    assert 0 < trainable < total / 4
    first = trainer.update(samples)
    second = trainer.update(samples)
    assert first["kl_mean"] == 0.0 or abs(first["kl_mean"]) < 1e-6  # adapters start at zero: policy == reference
    assert second["kl_mean"] > 0.0
    # the LoRA-wrapped model still samples
    wrapped = Policy("lora", trainer.model, random_policy.tokenizer, "compact")
    assert _engine(wrapped).generate(["W:\n"], SamplingParams(max_new_tokens=4), seed=0)[0].token_ids


def test_lora_adapters_start_from_the_trainers_seed(random_policy):
    """Every rank, and every run, starts from the same adapters: their random start draws from the trainer's seed, not
    from the process's random state (which differs between ranks), and leaves that state alone."""
    import copy

    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    starts = []
    for process_seed, trainer_seed in ((1, 0), (2, 0), (1, 5)):
        torch.manual_seed(process_seed)
        next_draw = torch.rand(3)
        torch.manual_seed(process_seed)
        trainer = PolicyTrainer(copy.deepcopy(random_policy.model), random_policy.tokenizer,
                                UpdateSettings(lora=lora), seed=trainer_seed)
        assert torch.equal(torch.rand(3), next_draw)  # the process's random state is as it was
        starts.append([p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n])
    assert all(torch.equal(a, b) for a, b in zip(starts[0], starts[1]))
    assert not all(torch.equal(a, b) for a, b in zip(starts[0], starts[2]))


def test_micro_batches_accumulate_to_the_full_batch_step(random_policy):
    """One optimizer step over 4 sequences accumulates the same gradient with micro-batches of 1, 2 or 4."""
    import copy

    completions = _engine(random_policy).generate(PROMPTS, SamplingParams(max_new_tokens=10), seed=4)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, a) for c, a in zip(completions, [1, -0.5, 2, -1])]
    results = []
    for agg in ("seq_mean", "token_mean", "token_sum_norm"):
        weights = []
        for micro in (1, 2, 4):
            model = copy.deepcopy(random_policy.model)
            trainer = PolicyTrainer(model, random_policy.tokenizer, UpdateSettings(
                lr=1e-2, micro_batch_size=micro, loss_agg=agg, norm_constant=25, grad_clip=0.0))
            trainer.update(samples)
            weights.append(torch.cat([p.grad.flatten() for p in model.parameters()]))  # grads stay after step
        assert torch.allclose(weights[0], weights[1], atol=1e-6) and torch.allclose(weights[0], weights[2], atol=1e-6)
        results.append(weights[0])
    assert not torch.allclose(results[0], results[2])  # C=25 differs from the per-sequence mean



def test_micro_batches_by_tokens_accumulate_the_same_step_as_by_sequences(random_policy):
    """Micro-batches cut by a token budget (packed or padded; pi_old and the reference cut the same way) accumulate
    the gradient that micro-batches of sequences do, and no pass exceeds the budget unless one sequence does."""
    import copy

    from coevolve.rl.trainer import _micro_batch_order, _pass_tokens, micro_batches

    gen = torch.Generator().manual_seed(0)
    prompts = [random_policy.tokenizer(p)["input_ids"] for p in PROMPTS]
    samples = [TrainSample(prompts[k % 4], torch.randint(3, 100, (n,), generator=gen).tolist(), [-3.0] * n, a)
               for k, (n, a) in enumerate(zip((5, 12, 9, 3, 30, 2, 7, 4), (1, -0.5, 2, -1, 0.5, 1, -2, 0.3)))]
    results = []
    for by in ({"micro_batch_size": 3}, {"micro_batch_tokens": 40}, {"micro_batch_tokens": 90}):
        # two epochs of one step: the second step's pi_old and reference come from the no-grad passes
        settings = UpdateSettings(lr=1e-2, epochs=2, kl_beta=0.1, loss_agg="token_mean", grad_clip=0.0, **by)
        model = copy.deepcopy(random_policy.model)
        trainer = PolicyTrainer(model, random_policy.tokenizer, settings)
        cuts = micro_batches(model, samples, _micro_batch_order(model, samples, range(len(samples))), settings)
        assert sorted(i for cut in cuts for i in cut) == list(range(len(samples)))
        if settings.micro_batch_tokens:
            assert len(cuts) > 1 and max(len(cut) for cut in cuts) > 1
            for cut in cuts:
                part = [samples[i] for i in cut]
                tokens = _pass_tokens(model, sum(len(s.completion_ids) for s in part)
                                      + sum(len(p) for p in {tuple(s.prompt_ids) for s in part}),
                                      max(len(s.prompt_ids) + len(s.completion_ids) for s in part), len(part))
                assert tokens <= settings.micro_batch_tokens or len(part) == 1
        stats = trainer.update(samples)
        assert stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
        results.append((torch.cat([p.grad.flatten() for p in model.parameters()]), stats))
    for grads, stats in results[1:]:
        assert torch.allclose(grads, results[0][0], atol=1e-5)
        assert stats.keys() == results[0][1].keys()
        assert all(abs(stats[k] - results[0][1][k]) < 1e-5 for k in stats)


def test_a_samples_own_upper_clip_range_reaches_the_loss(random_policy):
    """ADPO: TrainSample.clip_high replaces the trainer's clip_high for that sample. Three epochs of one positive
    sample: after the first, its ratio rises above 1, past a clip_high of 0 but not of 10."""
    import copy

    c = _engine(random_policy).generate(["Q:2+2=?\n"], SamplingParams(temperature=1.0, max_new_tokens=8), seed=5)[0]
    fractions = []
    for own in (None, 10.0):
        trainer = PolicyTrainer(copy.deepcopy(random_policy.model), random_policy.tokenizer,
                                UpdateSettings(lr=1e-2, micro_batch_size=1, epochs=3, clip_high=0.0))
        stats = trainer.update([TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 1.0, (), own)])
        fractions.append(stats["clip_frac_high"])
    assert fractions[0] > 0 and fractions[1] == 0
