"""The rollout interface every sampling engine implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

# The seed contract of ``RolloutEngine.generate``: prompt j of a call with seed s is sampled as the first prompt of a
# call with seed s + j * PROMPT_SEED_STRIDE would be (for the HF engine, j a multiple of its batch size: a batch
# shares one random stream). A call on a slice of the prompts then reproduces the whole call's samples.
PROMPT_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature 0 means greedy; top_k 0 and top_p 1 mean no truncation.

    ``regex``: constrain every completion to match it (constrained decoding, :mod:`coevolve.rollout.constrained`);
    the completion's log-probs are then those of the masked, renormalised distribution it was sampled from.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    regex: str | None = None


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    ``logprobs[t]`` is the log-probability the sampler gave ``token_ids[t]`` under the
    temperature-scaled distribution (before top-p / top-k truncation), the quantity the
    trainer recomputes as pi_old for the PPO ratio.

    An episode (``rollout.tools``, :mod:`coevolve.rollout.episodes`) interleaves the model's tokens with tool
    observations: ``tool_mask[t]`` is True where ``token_ids[t]`` came from a tool (its log-prob is a placeholder
    0.0 the trainer never reads); an empty ``tool_mask`` means the model wrote every token. ``tool_calls``: the tool
    calls the episode ran. ``observation_spans``: the (start, end) character ranges of ``text`` that tools wrote;
    :attr:`written_text` is the text without them, what an answer is read from.
    """

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # "eos" | "stop" | "length" | "tool_limit" (an episode asked for one call too many)
    tool_mask: list[bool] = field(default_factory=list)
    tool_calls: int = 0
    observation_spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def written_text(self) -> str:
        """The text the model wrote: each tool observation replaced by a newline (so no answer is ever read from a
        tool's output, and no two pieces of the model's text join across it). ``text`` without observations."""
        parts, start = [], 0
        for begin, end in self.observation_spans:
            parts += [self.text[start:begin], "\n"]
            start = end
        return "".join(parts) + self.text[start:]

    def tool_token_spans(self) -> list[tuple[int, int]]:
        """The (start, end) token ranges of ``token_ids`` that tools wrote (runs of ``tool_mask``)."""
        spans: list[tuple[int, int]] = []
        for t, from_tool in enumerate(self.tool_mask):
            if from_tool and spans and spans[-1][1] == t:
                spans[-1] = (spans[-1][0], t + 1)
            elif from_tool:
                spans.append((t, t + 1))
        return spans


class RolloutEngine(Protocol):
    """Samples completions for many prompts in one call, reproducibly for a given seed.

    An engine that holds its own copy of the weights (vLLM, a bf16 copy) loads the live model's weights before sampling
    whenever the version its trainer publishes changed; one that samples from the live model (HF) has nothing to
    load.
    """

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        """Return one completion per prompt, in prompt order (repeat a prompt for a group)."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """Engine costs since the last call (for example ``time/weight_sync_s``); empty when there are none."""
        ...


def fixed_weights() -> int:
    """The weights version of a policy that nothing trains: its sampler loads the weights once."""
    return 0


def distinct_prompts(prompt_ids: Sequence[Sequence[int]], device: torch.device | str = "cpu",
                     ) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The distinct prompts of a batch in first-seen order, and for each prompt the index of its distinct copy: a
    sampler prefills each distinct prompt once and copies its cache to every row that shares it."""
    distinct = list(dict.fromkeys(map(tuple, prompt_ids)))
    index = {ids: i for i, ids in enumerate(distinct)}
    return distinct, torch.tensor([index[tuple(ids)] for ids in prompt_ids], device=device)


STOP_WINDOW = 16  # a row stops when the text of its last STOP_WINDOW tokens holds a stop string


def holds_stop(tokenizer, tokens: Sequence[int], stop: Sequence[str], window: int | None = STOP_WINDOW) -> bool:
    """Whether the text of the last ``window`` of ``tokens`` (None: all of them) holds one of the ``stop`` strings."""
    text = tokenizer.decode(list(tokens[-window:] if window else tokens), skip_special_tokens=True)
    return any(s in text for s in stop)
