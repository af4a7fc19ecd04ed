"""Tool-using episodes (``coevolve/rollout/episodes.py``): episodes per second, the share of their time spent in the
sandboxed tool, and their cost against single-turn sampling of the same tokens.

The model is a GPT-2 of a real shape (``--width``, ``--layers``) whose weights are zero but for one-hot position
embeddings and a head that makes its greedy output a script by position: ``--calls`` python calls
(``print(6*7)``), each followed by its observation, then ``A:42`` and EOS. Every layer still computes, so sampling
costs what a model of that shape costs. The episodes run through the HF engine (plain loop on the CPU, the static
decoder on CUDA) and the real executor (one worker per CPU); the single-turn baseline samples the whole script,
observations included, in one call: the same tokens, no tool, no re-prefill.

Run from the repository root: ``.venv/bin/python bench/episodes.py [--episodes N] [--calls K] [--quick]``.
Writes ``bench/results/episodes.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from speed import RESULTS_DIR, machine_info, run_header, warn_if_busy, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevolve.execution import Executor  # noqa: E402
from coevolve.models.tiny_arith import build_tokenizer  # noqa: E402
from coevolve.rollout import SamplingParams  # noqa: E402
from coevolve.rollout.episodes import TOOL_LIMITS, EpisodeEngine, ToolResult, observation, python_tool  # noqa: E402
from coevolve.rollout.hf import HFRolloutEngine  # noqa: E402

PROMPT = "Q:?"  # <s> Q : ? : the first new token is predicted at position 3
CALL = "```python\nprint(6*7)\n```\n```output"


def script(calls: int) -> str:
    return (CALL + observation(ToolResult("42", "ok"))) * calls + "A:42"


def scripted_gpt2(tokenizer, text: str, width: int, layers: int):
    """A GPT-2 (``width`` hidden and positions, ``layers`` blocks) whose greedy continuation of PROMPT is ``text``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if len(text) + 4 > width:
        raise SystemExit(f"--width {width} holds no script of {len(text)} characters")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=width, n_embd=width, n_layer=layers,
                        n_head=max(1, width // 64), tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.fill_(1.0)
        model.transformer.wpe.weight.copy_(torch.eye(width))
        for p in range(width):
            k = p - 3
            target = (tokenizer.convert_tokens_to_ids(text[k]) if 0 <= k < len(text) else tokenizer.eos_token_id)
            model.lm_head.weight[target, p] = 10.0
    return model


def prefill_seconds(model, tokenizer, text: str, rows: int, device: str) -> dict[str, float]:
    """What the re-prefill of each turn costs against continuing from the KV cache, for ``rows`` episodes of the
    script ``text``: at every turn after the first, one forward pass over the prompt and the whole episode so far
    (what ``EpisodeEngine`` does through the engine's ``generate``) against one forward pass over only the
    observation's tokens with the cache of everything before it (what a continuation would run; it would keep the
    cache it decoded, so building that cache is not counted)."""
    from transformers import DynamicCache

    ids = tokenizer(PROMPT + text, add_special_tokens=True)["input_ids"]
    prompt_len = len(tokenizer(PROMPT, add_special_tokens=True)["input_ids"])
    bounds, start = [], 0  # (observation start, observation end) in token positions of ids, per call
    while (at := text.find("```output", start)) >= 0:
        obs = observation(ToolResult("42", "ok"))
        first = prompt_len + len(tokenizer(text[:at + len("```output")], add_special_tokens=False)["input_ids"])
        bounds.append((first, first + len(tokenizer(obs, add_special_tokens=False)["input_ids"])))
        start = at + 1
    batch = torch.tensor([ids] * rows, device=device)
    reprefill = continuation = 0.0
    with torch.no_grad():
        for first, last in bounds:
            started = time.perf_counter()
            model(batch[:, :last])
            reprefill += time.perf_counter() - started
            cache = DynamicCache()
            model(batch[:, :first], past_key_values=cache, use_cache=True)
            started = time.perf_counter()
            model(batch[:, first:last], past_key_values=cache, use_cache=True)
            continuation += time.perf_counter() - started
    return {"reprefill_s": reprefill, "continuation_s": continuation}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="tool calls per episode")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 episodes, 2 calls, width 192, 2 layers, 1 repeat")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "episodes.json")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.calls, args.width, args.layers, args.repeats = 8, 2, 192, 2, 1
    warn_if_busy()
    machine = machine_info()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    text = script(args.calls)
    model = scripted_gpt2(tokenizer, text, args.width, args.layers).to(device)
    engine = HFRolloutEngine(model, tokenizer, batch_size=args.episodes,
                             dtype=torch.float32 if device == "cuda" else None)
    prompts = [PROMPT] * args.episodes
    params = SamplingParams(temperature=0.0, max_new_tokens=len(text) + 1)
    workers = len(os.sched_getaffinity(0))
    episode_s, tool_s, single_s = [], [], []
    with Executor(TOOL_LIMITS, workers=workers) as executor:
        episodes = EpisodeEngine(engine, tokenizer, python_tool(executor), max_tool_calls=args.calls)
        for _ in range(args.repeats + 1):  # the first round warms up (and checks the script)
            start = time.perf_counter()
            got = episodes.generate(prompts, params, seed=0)
            episode_s.append(time.perf_counter() - start)
            tool_s.append(episodes.pop_metrics().get("time/tool_s", 0.0))
            start = time.perf_counter()
            single = engine.generate(prompts, params, seed=0)
            single_s.append(time.perf_counter() - start)
    if any(c.text != text or c.tool_calls != args.calls for c in got) or any(c.text != text for c in single):
        raise SystemExit("the scripted model did not write its script: the benchmark measured something else")
    episode_s, tool_s, single_s = episode_s[1:], tool_s[1:], single_s[1:]
    prefill = [prefill_seconds(model, tokenizer, text, args.episodes, device) for _ in range(args.repeats)]
    reprefill_s = statistics.median(p["reprefill_s"] for p in prefill)
    continuation_s = statistics.median(p["continuation_s"] for p in prefill)
    tokens = args.episodes * (len(text) + 1)
    results = {"device": device, "episodes": args.episodes, "calls_per_episode": args.calls, "width": args.width,
               "layers": args.layers, "workers": workers, "tokens_per_episode": len(text) + 1,
               "episode_seconds": episode_s, "tool_seconds": tool_s, "single_turn_seconds": single_s,
               "episodes_per_second": args.episodes / statistics.median(episode_s),
               "tool_share": statistics.median(t / e for t, e in zip(tool_s, episode_s)),
               "episode_over_single_turn": statistics.median(episode_s) / statistics.median(single_s),
               "single_turn_tokens_per_second": tokens / statistics.median(single_s),
               "reprefill_seconds": reprefill_s, "continuation_seconds": continuation_s,
               "reprefill_share": reprefill_s / statistics.median(episode_s),
               "continuation_would_save_share": (reprefill_s - continuation_s) / statistics.median(episode_s)}
    machine["load_avg_end"] = list(os.getloadavg())
    write_json(args.out, {**run_header(), "machine": machine, **results})
    print(f"{args.episodes} episodes x {args.calls} calls, {len(text) + 1} tokens each, GPT-2 {args.width}x"
          f"{args.layers} on {device}, {workers} sandbox workers (median of {args.repeats})")
    print(f"episodes per second            {results['episodes_per_second']:.2f}")
    print(f"share of time in the tool      {results['tool_share']:.1%}")
    print(f"episode time / single-turn     {results['episode_over_single_turn']:.2f}x "
          f"(single turn: {results['single_turn_tokens_per_second']:.0f} tokens/s)")
    print(f"re-prefills of the turns        {reprefill_s:.3f} s ({results['reprefill_share']:.1%} of an episode batch);"
          f" continuing from the KV cache instead: {continuation_s:.3f} s, saving at most "
          f"{results['continuation_would_save_share']:.1%}")
    print(f"load average {machine['load_avg_1_5_15'][0]:.2f} at start, {machine['load_avg_end'][0]:.2f} at end; "
          f"wrote {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
