"""Constrained decoding on the vLLM engine (CPU build): outputs match the regex and the recorded log-probs are those of
the masked, renormalised distribution (the HF engine's constrained recomputation), not the unconstrained ones."""

from __future__ import annotations

import os
import re

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("COEVOLVE_VLLM") == "0", reason="setup left vLLM out (COEVOLVE_VLLM=0)")

REGEX = r"[1-9][0-9]?\+[1-9][0-9]?"


def test_vllm_constrained_outputs_and_logprobs(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from coevolve.models import load_policy
    from coevolve.models.tiny_arith import build_tokenizer
    from coevolve.rollout import SamplingParams
    from coevolve.rollout.constrained import RegexConstraint
    from coevolve.rollout.hf import encode_prompt
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "build_info.json").write_text('{"note": "random weights for tests"}\n')
    policy = load_policy(str(tmp_path))
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(tmp_path), eos_token_ids=policy.eos_token_ids,
                               settings=VLLMSettings(kv_cache_gib=0.05))
    out = engine.generate(["W:"] * 6, SamplingParams(temperature=1.0, max_new_tokens=12, regex=REGEX), seed=0)
    assert all(re.fullmatch(REGEX, c.text) for c in out), [c.text for c in out]
    for c in out:
        ids = torch.tensor([encode_prompt(policy.tokenizer, "W:") + c.token_ids])
        with torch.no_grad():
            logits = policy.model(ids).logits[0, -len(c.token_ids) - 1:-1].float()
        constraint = RegexConstraint(policy.tokenizer, logits.shape[-1], REGEX, policy.eos_token_ids, 1)
        masked = []
        for t, token in enumerate(c.token_ids):
            masked.append(constraint.mask(logits[t:t + 1], [0], [True])[0].log_softmax(-1)[token])
            constraint.accept([token], [0], [True])
        assert torch.allclose(torch.tensor(c.logprobs), torch.stack(masked), atol=1e-4), (c.logprobs, masked)
