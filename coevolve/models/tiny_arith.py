"""The built-in tiny-arith model: a ~1M-parameter character-level Llama pretrained on the arithmetic world.

It is built (deterministically, in a few minutes on 2 CPU cores) the first time it is asked for and
cached under ``$COEVOLVE_CACHE/models`` (default ``~/.cache/coevolve/models``) in a folder named
after a hash of the build settings and the format versions, so a change to either builds a new one.

Pretraining mixture (compact formats of :mod:`coevolve.tasks.arith`, levels 1..``max_level``):
40% plain solve samples, 30% grounded solve samples, and 10% each of question writing from
nothing (``W:``), like examples (``E:``) and from a fact sheet with the worked answer (``D:``).
Like a corpus in which many worked solutions of multi-step problems state only the result, a share
``bare_answer_rate`` (60%) of the solve samples of level 2 and above are the bare answer ``A:<n>``
without the step-by-step trace; one-step problems always show their single step. The model so
answers most multi-step questions at once, which it rarely gets right, while it still writes the
worked trace in some samples: a reward for correct answers can teach it to show its work, the way
RL on language models elicits longer reasoning. (A build trained on traces only, BUILD_VERSION 1,
left GRPO with ground truth nothing it could learn in a few hundred steps: held-out level 3 stayed
at 39% greedy accuracy over 150 steps.)
The loss covers completion tokens and EOS only: prompts are mostly uniformly random digits whose
loss cannot fall, and would only add gradient noise; writing questions is taught by the
question-writing samples, whose completion *is* the question. The model is meant to be only partly
competent (good at level 1, poor beyond level 3) so the self-evolving recipes have room to work.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
import transformers
from filelock import FileLock  # a dependency of huggingface_hub, hence always installed with transformers
from tokenizers import Tokenizer, decoders, models, processors
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from coevolve.rollout.base import SamplingParams
from coevolve.rollout.episodes import observation_spans
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.tasks import arith

BUILD_VERSION = 3  # bump when the pretraining code changes what a build produces
CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"  # printable ASCII and newline, one token each
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
MIXTURE = (("solve", 0.4), ("solve_grounded", 0.3), ("write", 0.1), ("write_examples", 0.1),
           ("write_grounded", 0.1))
SORT_WINDOW = 32  # batches whose samples are sorted by length together, to cut padding


@dataclass(frozen=True)
class TinyArithBuild:
    """Settings of one tiny-arith build; the cache folder name is a hash of them."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    steps: int = 6000
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    max_level: int = 3
    bare_answer_rate: float = 0.6  # solve samples of level >= 2 that give only ``A:<n>`` (no trace)
    eval_n: int = 200  # held-out problems per level in the build report
    threads: int = 1  # torch threads while training (0: one per core); the weights depend on it

    @classmethod
    def default(cls) -> TinyArithBuild:
        """The real model (about 1.05M parameters, a few minutes on 2 cores)."""
        return cls()

    @classmethod
    def for_tests(cls) -> TinyArithBuild:
        """A much weaker model that builds in well under a minute; enough to emit the (traced) formats."""
        return cls(hidden=64, layers=2, heads=2, intermediate=128, steps=400, lr=3e-3, warmup=20, eval_n=20,
                   bare_answer_rate=0.0)

    def fingerprint(self) -> str:
        """Short hash of the settings and the format and build-code versions."""
        payload = json.dumps({**asdict(self), "format": arith.FORMAT_VERSION, "build": BUILD_VERSION},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    # --- what a character-level build needs besides its settings (CharModelBuild) ---
    corpus = "tiny-arith"  # names the build: the data-order seed, the progress bar, the cache folder

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """One (prompt, completion) pair of the pretraining mixture."""
        return _sample(rng, self.max_level, self.bare_answer_rate)

    def report(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> dict:
        """What ``build_info.json`` says the model can do: greedy accuracy per level, plain and grounded, and the
        share of valid written questions."""
        return {"accuracy": greedy_accuracy(model, tokenizer, self.eval_n),
                "grounded_accuracy": greedy_accuracy(model, tokenizer, self.eval_n, grounded=True),
                "valid_question_rate": valid_question_rate(model, tokenizer, self.eval_n),
                "format_version": arith.FORMAT_VERSION, "build_version": BUILD_VERSION}


class CharModelBuild(Protocol):
    """What the shared build machinery (:func:`pretrain`, :func:`ensure_built`) needs of a character-level model's
    build settings: the model shape and optimisation fields of :class:`TinyArithBuild`, a corpus name, a sampler of
    the pretraining mixture, a report of what the model can do, and a fingerprint of all of it."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    steps: int
    batch: int
    lr: float
    warmup: int
    weight_decay: float
    seed: int
    threads: int
    corpus: str

    def sample(self, rng: random.Random) -> tuple[str, str]: ...

    def report(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> dict: ...

    def fingerprint(self) -> str: ...


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer: one token per printable ASCII character or newline, BOS prepended."""
    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + list(CHARS))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: one token per char
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512)


def _new_model(build: CharModelBuild, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=build.hidden, intermediate_size=build.intermediate,
        num_hidden_layers=build.layers, num_attention_heads=build.heads, num_key_value_heads=build.heads,
        max_position_embeddings=512, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def _sample(rng: random.Random, max_level: int, bare_answer_rate: float) -> tuple[str, str]:
    """One (prompt, completion) pair of the pretraining mixture."""
    kind = rng.choices([k for k, _ in MIXTURE], weights=[w for _, w in MIXTURE])[0]
    level = rng.randint(1, max_level)
    problem = arith.sample_problems(1, rng, levels=(level,), grounded=kind.endswith("grounded"))[0]
    if kind.startswith("solve"):
        bare = level >= 2 and bare_answer_rate > 0 and rng.random() < bare_answer_rate
        return (arith.solver_prompt(problem.question, problem.doc),
                f"A:{problem.answer}" if bare else arith.solve_completion(problem))
    examples: list[str] = []
    if kind == "write_examples":
        near = [max(1, min(max_level, level + d)) for d in rng.choices((-1, 0, 0, 1), k=rng.randint(1, 4))]
        examples = [arith.sample_problems(1, rng, levels=(lv,))[0].question for lv in near]
    return arith.question_prompt(examples=examples, doc=problem.doc), arith.question_completion(problem)


def _batches(build: CharModelBuild, tokenizer: PreTrainedTokenizerFast):
    """Yield (input_ids, attention_mask, labels) batches in a fixed order given by the build seed. A completion's
    tool observations (:func:`coevolve.rollout.episodes.observation_spans`: the tool wrote them, not the model) are
    left out of the loss, as the RL trainer leaves them out."""
    rng = random.Random(f"{build.corpus}/{build.seed}")
    for _ in range(0, build.steps, SORT_WINDOW):
        pairs = [build.sample(rng) for _ in range(SORT_WINDOW * build.batch)]
        prompts = tokenizer([p for p, _ in pairs])["input_ids"]
        completions = tokenizer([c for _, c in pairs], add_special_tokens=False)["input_ids"]
        unscored = [observation_spans(c) for _, c in pairs]  # character ranges = token ranges (one token a char)
        rows = sorted(zip(prompts, completions, unscored), key=lambda r: len(r[0]) + len(r[1]))
        chunks = [rows[i:i + build.batch] for i in range(0, len(rows), build.batch)]
        rng.shuffle(chunks)
        for chunk in chunks:
            yield _collate(chunk, tokenizer.pad_token_id, tokenizer.eos_token_id)


def _collate(rows: list[tuple[list[int], list[int], list[tuple[int, int]]]], pad_id: int, eos_id: int):
    width = max(len(p) + len(c) + 1 for p, c, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, completion, unscored) in enumerate(rows):
        seq = prompt + completion + [eos_id]
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(prompt):len(seq)] = torch.tensor(completion + [eos_id])
        for start, end in unscored:
            labels[i, len(prompt) + start:len(prompt) + end] = -100
        mask[i, :len(seq)] = 1
    return ids, mask, labels


def _lr_factor(step: int, build: CharModelBuild) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < build.warmup:
        return (step + 1) / build.warmup
    progress = (step - build.warmup) / max(1, build.steps - build.warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


@contextmanager
def _torch_threads(build: CharModelBuild) -> Iterator[None]:
    """Run with the build's torch thread count, restoring the caller's afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(build.threads or max(1, os.cpu_count() or 1))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def pretrain(build: CharModelBuild,
             progress: bool = False) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, list[float]]:
    """Train a fresh model from scratch; returns (model in eval mode, tokenizer, loss per step).

    Deterministic for given settings on a given machine: seeded init and data order, and a fixed
    number of torch threads while it runs (the caller's thread count is restored after).
    """
    with _torch_threads(build):
        return _pretrain(build, progress)


def _pretrain(build: CharModelBuild, progress: bool) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, list[float]]:
    torch.manual_seed(build.seed)
    tokenizer = build_tokenizer()
    model = _new_model(build, tokenizer)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": build.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=build.lr, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, build))
    model.train()
    losses: list[float] = []
    bar = tqdm(total=build.steps, desc=f"building {build.corpus}", disable=not progress, unit="step")
    for step, (ids, mask, labels) in zip(range(build.steps), _batches(build, tokenizer)):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    return model, tokenizer, losses


def greedy_accuracy(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int = 200,
                    levels: tuple[int, ...] = arith.LEVELS, grounded: bool = False) -> dict[int, float]:
    """Greedy exact-match accuracy per level on the first ``n`` held-out problems of each level."""
    problems = [p for level in levels for p in arith.held_out(level, n, grounded=grounded)]
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    params = SamplingParams(temperature=0.0, max_new_tokens=48 + 32 * max(levels))
    outputs = engine.generate([arith.solver_prompt(p.question, p.doc) for p in problems], params, seed=0)
    correct = {level: 0 for level in levels}
    for output, problem in zip(outputs, problems):
        correct[problem.level] += arith.parse_answer(output.text) == str(problem.answer)
    return {level: correct[level] / max(1, n) for level in levels}


def valid_question_rate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int = 200) -> float:
    """Share of ``W:`` samples (temperature 1) that parse as valid questions."""
    engine = HFRolloutEngine(model, tokenizer, batch_size=200)
    outputs = engine.generate([arith.question_prompt()] * n, SamplingParams(temperature=1.0, max_new_tokens=64), seed=0)
    return sum(arith.parse_question(o.text) is not None for o in outputs) / max(1, n)


def _build_into(folder: Path, build: CharModelBuild, progress: bool) -> None:
    start = time.time()
    model, tokenizer, losses = pretrain(build, progress)
    trained = time.time()
    with torch.no_grad(), _torch_threads(build):
        report = build.report(model, tokenizer)
    versions = {key: report.pop(key) for key in ("format_version", "build_version")}
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    info = {
        "build": asdict(build), "fingerprint": build.fingerprint(), **versions,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": build.threads or max(1, os.cpu_count() or 1),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "seconds": {"train": round(trained - start, 1), "eval": round(time.time() - trained, 1),
                    "total": round(time.time() - start, 1)},
        **report, "torch": torch.__version__, "transformers": transformers.__version__,
    }
    (folder / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")


def default_cache_dir() -> Path:
    """Where built models live: ``$COEVOLVE_CACHE/models``, else ``~/.cache/coevolve/models``."""
    root = os.environ.get("COEVOLVE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "coevolve") / "models"


def ensure_tiny_arith(cache_dir: Path | None = None, build: TinyArithBuild | None = None,
                      progress: bool = True) -> Path:
    """The folder of the tiny-arith model for ``build`` (default settings), building it on first use.

    The folder is ``<cache_dir>/tiny-arith-<fingerprint>`` (``cache_dir`` defaults to
    :func:`default_cache_dir`). A build runs in a temporary folder under a file lock and is
    renamed into place when complete, so concurrent callers wait for one build and never see a
    partial folder. It holds the safetensors weights, the tokenizer and ``build_info.json``.
    """
    return ensure_built(build or TinyArithBuild.default(), cache_dir, progress)


def ensure_built(build: CharModelBuild, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The folder ``<cache_dir>/<corpus>-<fingerprint>`` of a character-level build, built on first use
    (:func:`build_cached_folder`): safetensors weights, the tokenizer and ``build_info.json``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_cached_folder(root / f"{build.corpus}-{build.fingerprint()}", "build_info.json",
                               lambda folder: _build_into(folder, build, progress))


def build_cached_folder(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(folder)`` on first use: in a temporary folder beside it, under a file lock, then
    renamed into place, so concurrent callers wait for one build and never see a partial folder. The file ``marker``
    inside ``target`` says the build is complete."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / marker).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            if target.exists():  # a partial folder left by something other than this function
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
