"""Shared fixtures: small random models with the tiny-arith tokenizer (no pretraining, no network)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # the test models are tiny: one thread is as fast and never oversubscribes


# The files that take minutes (two-step loops on a 135M chat model), longest first: each xdist worker starts on one
# while the other files fill in around them (pyproject's --no-loadscope-reorder keeps this order; xdist's default
# reorders files by their number of tests, which sent these 2- and 4-test files last and left one worker idle at the
# end). A worker whose file has 2 tests or fewer left takes the next file, so a third long file here would land
# beside the first.
LONG_FILES = ("test_real_lm_warmup_loop.py", "test_real_lm_loop.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: order.get(item.path.name, len(LONG_FILES)))  # stable: each file's order is kept


@pytest.fixture
def random_policy():
    """A 2-layer random Llama with the character-level tokenizer, wrapped as a Policy."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from coevolve.models import Policy
    from coevolve.models.tiny_arith import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    return Policy(name="random", model=model, tokenizer=tokenizer, prompt_style="compact")


def save_random_llama(folder, *, hidden: int, **config):
    """A random 2-layer Llama with the tiny-arith tokenizer, saved like a tiny-arith build (read in the compact
    format)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from coevolve.models.tiny_arith import build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **config)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "build_info.json").write_text('{"note": "random weights for tests"}\n')
    return folder


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A random tiny Llama (head size 16) saved like a tiny-arith build."""
    return save_random_llama(tmp_path_factory.mktemp("random-tiny"), hidden=32)


def session_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test session that its pytest-xdist workers share (each worker's base folder sits in the
    session's); a build cached there under a file lock runs once for all of them."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def small_tiny_arith(tmp_path_factory):
    """(cache folder, model folder) of the quick tiny-arith test build: weak, but it writes the task formats. Built
    once per session (for every worker), or kept in ``COEVOLVE_TEST_CACHE`` across sessions when that is set
    (bench/mutation.py)."""
    from coevolve.models.tiny_arith import TinyArithBuild, ensure_tiny_arith

    kept = os.environ.get("COEVOLVE_TEST_CACHE")
    cache = Path(kept) if kept else session_folder(tmp_path_factory, "models")
    return cache, ensure_tiny_arith(cache, TinyArithBuild.for_tests(), progress=False)


@pytest.fixture(scope="session")
def small_tiny_program(tmp_path_factory):
    """(cache folder, model folder) of the quick tiny-program test build (AZR's program world), built once per session
    like :func:`small_tiny_arith`."""
    from coevolve.models.tiny_program import TinyProgramBuild, ensure_tiny_program

    kept = os.environ.get("COEVOLVE_TEST_CACHE")
    cache = Path(kept) if kept else session_folder(tmp_path_factory, "models")
    return cache, ensure_tiny_program(cache, TinyProgramBuild.for_tests(), progress=False)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A random tiny Llama with head size 32 (vLLM's CPU attention needs >= 32) and tied embeddings."""
    return save_random_llama(tmp_path_factory.mktemp("vllm-tiny"), hidden=64, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def dynamic_rl_run(small_tiny_arith, tmp_path_factory):
    """The uninterrupted one-process run of ``run_checks.DYNAMIC_RL_RUN`` that distributed and resumed runs match."""
    from run_checks import DYNAMIC_RL_RUN, launch

    out = tmp_path_factory.mktemp("dynamic-rl") / "one"
    done = launch([*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture
def model_threads():
    """Up to two torch threads for a test that trains a real model (the tiny test models run on one), as many as the
    cores this worker can count on: under pytest-xdist the other worker keeps the second of two cores busy, and two
    processes of two threads each on two cores ran the smollm2 loop tests 5-10x slower."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // workers)))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """smollm2-135m's weights as a plain folder: loads in seconds, not a GGUF."""
    from coevolve.models import smollm2_hf_folder

    return str(smollm2_hf_folder())
