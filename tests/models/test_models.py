"""Model loading: built-in names, local folders, clear one-line errors, the SmolLM2 GGUF without network."""

from __future__ import annotations

import pytest

from coevolve.models import ModelNotFoundError, load_policy
from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine


def test_local_tiny_folder_is_compact(random_model_dir):
    policy = load_policy(str(random_model_dir))
    assert policy.prompt_style == "compact"
    assert policy.format_prompt("Q:1+1=?\n") == "Q:1+1=?\n"
    assert policy.tokenizer.padding_side == "left"


def test_missing_path_and_unknown_name_are_clear(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_policy(str(tmp_path / "nothing-here"))
    with pytest.raises(ModelNotFoundError) as info:
        load_policy("no-such-org/no-such-model-xyz")  # offline: fails fast, no hang
    assert "\n" not in str(info.value) and "built-in names" in str(info.value)


def test_smollm2_from_the_packaged_gguf():
    policy = load_policy("smollm2-135m")
    assert policy.prompt_style == "chat"
    prompt = policy.format_prompt("What is 2+3?")
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    assert sum(p.numel() for p in policy.model.parameters()) > 100_000_000
    engine = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids)
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8), seed=0)[0]
    assert out.token_ids and out.text.strip()
