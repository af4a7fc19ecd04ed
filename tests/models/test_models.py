"""Model loading: built-in names, local folders, clear one-line errors, SmolLM2 from its GGUF without network."""

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


def test_smollm2_loads_its_folder_converted_from_the_packaged_gguf():
    """The built-in name reads the cached folder converted once from the GGUF: the GGUF's de-quantised weights, its
    tokenizer and chat template, and no quantisation left on the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coevolve.models import SMOLLM2_GGUF, _smollm2_dir, smollm2_hf_folder

    policy = load_policy("smollm2-135m")
    assert policy.prompt_style == "chat" and getattr(policy.model, "hf_quantizer", None) is None
    assert policy.model.name_or_path == str(smollm2_hf_folder())
    gguf_model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    gguf_weights, weights = gguf_model.state_dict(), policy.model.state_dict()
    assert gguf_weights.keys() == weights.keys()
    assert all(torch.equal(gguf_weights[name], weights[name]) for name in weights)
    gguf_tokenizer = AutoTokenizer.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    assert policy.tokenizer.chat_template == gguf_tokenizer.chat_template
    prompt = policy.format_prompt("What is 2+3? Ünïcode, tabs\tand 1234567 digits.")
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    assert policy.tokenizer(prompt)["input_ids"] == gguf_tokenizer(prompt)["input_ids"]
    engine = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids)
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8), seed=0)[0]
    assert out.token_ids and out.text.strip()
