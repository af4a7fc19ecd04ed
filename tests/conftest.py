"""Shared fixtures: small random models with the tiny-arith tokenizer (no pretraining, no network); a hermetic home.

The suite never reads or writes the user's home: before anything else, the first pytest process of a session points
HOME, the XDG folders, COEVOLVE_CACHE (built models, cluster spaces) and the Hugging Face and matplotlib caches at a
fresh folder of its own (its workers inherit them), removes it at the end, and fails the session if anything under the
real home's caches changed while it ran.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

HERMETIC_HOME = "COEVOLVE_TEST_HOME"  # set by the session's first process; its pytest-xdist workers inherit it
GUARDED = (".cache", ".config", ".triton", ".local/share")  # the real home's caches and settings, pip's cache aside


def _home_snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under the guarded folders of ``home``, without following symlinks."""
    files = {}
    for part in GUARDED:
        for folder, dirs, names in os.walk(home / part):
            if Path(folder) == home / ".cache":
                dirs[:] = [d for d in dirs if d != "pip"]
            for name in names:
                path = Path(folder, name)
                try:
                    info = path.lstat()
                except OSError:
                    continue
                files[str(path)] = (info.st_size, info.st_mtime_ns)
    return files


def _use_a_session_home() -> tuple[Path, Path] | None:
    """Point every home-relative location at a fresh folder; (that folder, the real home), or None in a worker."""
    if os.environ.get(HERMETIC_HOME):
        return None
    real, root = Path.home(), Path(tempfile.mkdtemp(prefix="coevolve-tests-"))
    home = root / "home"
    for name, path in (("HOME", home), ("XDG_CACHE_HOME", home / ".cache"), ("XDG_CONFIG_HOME", home / ".config"),
                       ("XDG_DATA_HOME", home / ".local" / "share"), ("COEVOLVE_CACHE", root / "coevolve"),
                       ("HF_HOME", root / "huggingface"), ("MPLCONFIGDIR", root / "matplotlib"),
                       ("TORCHINDUCTOR_CACHE_DIR", root / "torchinductor")):
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    os.environ[HERMETIC_HOME] = str(root)
    return root, real


_SESSION_HOME = _use_a_session_home()
_REAL_HOME_BEFORE = _home_snapshot(_SESSION_HOME[1]) if _SESSION_HOME else None

import torch  # noqa: E402  (after the environment above: libraries read their cache folders when imported)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # the test models are tiny: one thread is as fast and never oversubscribes


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session's first process: fail if the real home's caches changed, then remove the session's home."""
    if _SESSION_HOME is None:
        return
    root, real = _SESSION_HOME
    after = _home_snapshot(real)
    changed = sorted(set(after.items()) ^ set(_REAL_HOME_BEFORE.items()))
    if changed:
        names = sorted({path for path, _ in changed})
        session.config.get_terminal_writer().line(
            f"\nerror: the tests changed {len(names)} file(s) under the real home {real}: {', '.join(names[:5])}",
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(root, ignore_errors=True)


# The files that take minutes (vLLM and DDP/FSDP on 2 processes, R-Zero's loop on a 135M chat model), longest
# first: each xdist worker starts on one while the other files fill in around them, so the two finish together
# (pyproject's --no-loadscope-reorder keeps this order; xdist's default reorders files by their number of tests, which
# sent the long files with few tests last and left one worker idle at the end).
LONG_FILES = ("test_vllm_processes.py", "test_distributed.py", "test_real_lm_loop.py", "test_resume_scale.py",
              "test_multinode.py")


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
def small_tiny_calc(tmp_path_factory):
    """(cache folder, model folder) of the quick tiny-calc test build (episodes that call the python tool), built once
    per session like :func:`small_tiny_arith`."""
    from coevolve.models.tiny_calc import TinyCalcBuild, ensure_tiny_calc

    kept = os.environ.get("COEVOLVE_TEST_CACHE")
    cache = Path(kept) if kept else session_folder(tmp_path_factory, "models")
    return cache, ensure_tiny_calc(cache, TinyCalcBuild.for_tests(), progress=False)


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
