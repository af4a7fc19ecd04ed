"""Constrained decoding on the vLLM engine (CPU build): outputs match the regex and the recorded log-probs are those of
the masked, renormalised distribution (the HF engine's constrained recomputation), not the unconstrained ones."""

from __future__ import annotations

import os
import re

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("COEVOLVE_VLLM") == "0", reason="setup left vLLM out (COEVOLVE_VLLM=0)")

REGEX = r"[1-9][0-9]?\+[1-9][0-9]?"


def test_vllm_constrained_outputs_and_logprobs(vllm_model_dir):
    from coevolve.models import load_policy
    from coevolve.rollout import SamplingParams
    from coevolve.rollout.constrained import RegexConstraint
    from coevolve.rollout.hf import encode_prompt
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    policy = load_policy(str(vllm_model_dir))
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(vllm_model_dir), eos_token_ids=policy.eos_token_ids,
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
