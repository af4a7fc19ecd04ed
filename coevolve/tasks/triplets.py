"""AZR's task triplets: what a program world is to the ``azr`` recipe, and the per-type task buffers.

A task is a (program, input, output) triplet (Absolute Zero, arXiv 2505.03335, §3.2). Its three types each hide one
part: deduction shows (p, i) and asks for o; abduction shows (p, o) and asks for an input i with p(i) = o; induction
shows half of N (input, output) pairs and a message m and asks for a program that maps the other half.

A :class:`ProgramWorld` is one implementation of programs: the tiny model's integer functions
(:mod:`coevolve.tasks.program`, computed exactly in this process) or Python functions run by the sandboxed executor
(:mod:`coevolve.tasks.python_programs`). It writes the proposer's and the solver's prompts, reads their outputs,
validates proposals (§3.3.3: the program runs, is safe and deterministic) and checks answers (§3.3.4). The recipe sees
only this interface, so one recipe file serves both worlds.

:class:`TaskBuffers` holds the validated triplets of each type (§3.3.1-3.3.2): K references drawn uniformly for a
proposer, programs for the induction proposer drawn from the deduction and abduction buffers together, and old tasks
to fill a solver batch. It round-trips through JSON for checkpoints.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["deduction", "abduction", "induction"]
KINDS: tuple[Kind, ...] = ("deduction", "abduction", "induction")
# Why a proposal is not a valid task: its text lacks the format's parts; the program (or an input) does not parse;
# it uses a forbidden module; running it raised, returned nothing or left the world's bounds; it ran out of time or of
# another resource (memory, output, processes); two runs disagreed.
INVALID_REASONS = ("format", "syntax", "forbidden", "error", "timeout", "resource", "nondeterministic")
# DeepSeek-R1-Zero's prompt template (DeepSeek-R1, arXiv 2501.12948, Table 1), as AZR's code fills it
# (``instruction_following``): the task after "User:", the assistant's turn opened with "<think>".
R1_ZERO_TEMPLATE = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                    "The assistant first thinks about the reasoning process in the mind and then provides the user "
                    "with the answer. The reasoning process and answer are enclosed within <think> </think> and "
                    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> "
                    "answer here </answer>. User: {}\nAssistant: <think>")


def r1_zero_prompt(message: str) -> str:
    """A task message wrapped in R1-Zero's template; the model reads it as plain text (no chat template)."""
    return R1_ZERO_TEMPLATE.format(message)


@dataclass(frozen=True)
class Triplet:
    """A validated task: the program, its inputs and outputs as text (one of each for deduction and abduction, N for
    induction), and the induction proposer's message."""

    program: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    message: str = ""

    @property
    def given(self) -> list[tuple[str, str]]:
        """The (input, output) pairs an induction solver sees: the first half (§3.3.3, x = ({i^n, o^n}^{N//2}, m))."""
        half = len(self.inputs) // 2
        return list(zip(self.inputs[:half], self.outputs[:half]))

    @property
    def hidden(self) -> list[tuple[str, str]]:
        """The pairs an induction solver's program is checked on: the second half."""
        half = len(self.inputs) // 2
        return list(zip(self.inputs[half:], self.outputs[half:]))

    def as_json(self) -> dict[str, Any]:
        return {"program": self.program, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "message": self.message}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Triplet:
        return cls(str(row["program"]), tuple(map(str, row["inputs"])), tuple(map(str, row["outputs"])),
                   str(row.get("message", "")))


@dataclass(frozen=True)
class Proposal:
    """What a proposer wrote, read by its world: a program and one input (deduction, abduction), or N inputs and a
    message for the given program (induction)."""

    kind: Kind
    program: str
    inputs: tuple[str, ...]
    message: str = ""


@dataclass(frozen=True)
class Validation:
    """A proposal's fate: its triplet when valid, else the reason (one of ``INVALID_REASONS``)."""

    triplet: Triplet | None
    reason: str | None = None


@dataclass
class ExecutionStats:
    """What running programs cost: jobs run, seconds spent in them, and how many hit the time limit."""

    jobs: int = 0
    seconds: float = 0.0
    timeouts: int = 0

    def add(self, other: ExecutionStats) -> None:
        self.jobs, self.seconds, self.timeouts = (self.jobs + other.jobs, self.seconds + other.seconds,
                                                  self.timeouts + other.timeouts)


class ProgramWorld:
    """One implementation of programs (see the module docstring). ``style`` is the policy's prompt style: "compact"
    for the character-level tiny models, "chat" for chat models."""

    name: str

    def seed_triplet(self) -> Triplet:
        """The zero triplet the buffers start from when they are empty (§3.3.1, Fig. 5: the identity function)."""
        raise NotImplementedError

    def proposer_prompt(self, kind: Kind, references: Sequence[Triplet], style: str) -> str:
        """The proposer's message: for deduction and abduction, K reference triplets to differ from; for induction,
        the one program (``references[0]``) to write inputs and a message for."""
        raise NotImplementedError

    def read_proposal(self, kind: Kind, text: str, program: str | None = None, strip: bool = False) -> Proposal | str:
        """The proposal in ``text`` (induction: for ``program``), or the reason it is invalid ("format", "syntax");
        ``strip``: the program without comments and top-level code other than definitions (seeding, §3.3.1)."""
        raise NotImplementedError

    def validate(self, proposals: Sequence[Proposal]) -> list[Validation]:
        """Run each proposal's program on its inputs (twice: determinism) and build its triplet, in one batch."""
        raise NotImplementedError

    def solver_prompt(self, kind: Kind, task: Triplet, style: str) -> str:
        """The solver's message: (p, i) for deduction, (p, o) for abduction, the given pairs and m for induction."""
        raise NotImplementedError

    def read_answer(self, kind: Kind, text: str) -> str | None:
        """The solver's answer (an output, an input, a program) in ``text``; None when it is not well formatted."""
        raise NotImplementedError

    def check(self, kind: Kind, tasks: Sequence[Triplet], answers: Sequence[str | None]) -> list[bool]:
        """Whether each answer solves its task, by execution (§3.3.4), in one batch; a None answer is wrong."""
        raise NotImplementedError

    def program_ops(self, program: str) -> frozenset[str]:
        """The operations a program uses (buffer diversity)."""
        raise NotImplementedError

    def proposer_regex(self, kind: Kind) -> str | None:
        """A regex of the proposer's format for constrained decoding (format help), if the world has one."""
        return None

    def solver_regex(self, kind: Kind) -> str | None:
        """A regex of the solver's answer format for constrained decoding, if the world has one."""
        return None

    def pop_execution_stats(self) -> ExecutionStats:
        """Execution costs since the last call."""
        return ExecutionStats()

    def close(self) -> None:
        """Release what the world holds (an executor's workers)."""


@dataclass
class BufferEntry:
    """One triplet of a buffer and the step that added it (0: seeding)."""

    triplet: Triplet
    step: int


@dataclass
class TaskBuffers:
    """The task buffers D_deduction, D_abduction, D_induction (§3.3.2): append-only up to ``max_size`` each (AZR's
    max programs: the oldest are kept, later additions dropped), sampled uniformly with replacement."""

    max_size: int = 16384
    entries: dict[str, list[BufferEntry]] = field(default_factory=lambda: {kind: [] for kind in KINDS})

    def __len__(self) -> int:
        return sum(len(e) for e in self.entries.values())

    def size(self, kind: Kind) -> int:
        return len(self.entries[kind])

    def add(self, kind: Kind, triplets: Sequence[Triplet], step: int) -> int:
        """Append valid triplets of ``kind`` (up to ``max_size``); returns how many were kept."""
        room = max(0, self.max_size - len(self.entries[kind]))
        kept = list(triplets)[:room]
        self.entries[kind] += [BufferEntry(t, step) for t in kept]
        return len(kept)

    def references(self, kind: Kind, k: int, rng: random.Random) -> list[Triplet]:
        """Up to ``k`` reference triplets drawn uniformly without replacement from ``kind``'s buffer."""
        pool = self.entries[kind]
        return [e.triplet for e in rng.sample(pool, min(k, len(pool)))]

    def induction_program(self, rng: random.Random) -> Triplet:
        """A triplet drawn uniformly from D_abduction ∪ D_deduction, whose program the induction proposer is given."""
        pool = self.entries["deduction"] + self.entries["abduction"]
        return rng.choice(pool).triplet

    def fill(self, kind: Kind, n: int, rng: random.Random) -> list[Triplet]:
        """``n`` earlier tasks of ``kind`` drawn uniformly with replacement (to fill a solver batch)."""
        pool = self.entries[kind]
        return [rng.choice(pool).triplet for _ in range(n)] if pool else []

    def triplets(self, kind: Kind) -> list[Triplet]:
        return [e.triplet for e in self.entries[kind]]

    def state_dict(self) -> dict[str, Any]:
        return {"max_size": self.max_size,
                "entries": {kind: [{**e.triplet.as_json(), "step": e.step} for e in entries]
                            for kind, entries in self.entries.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.max_size = int(state["max_size"])
        self.entries = {kind: [BufferEntry(Triplet.from_json(row), int(row["step"]))
                               for row in state["entries"].get(kind, [])] for kind in KINDS}


def buffer_stats(buffers: TaskBuffers, kind: Kind, world: ProgramWorld) -> dict[str, float]:
    """Size and diversity of one buffer: triplets, distinct programs, mean program length in characters, and how
    many distinct operations its programs use together."""
    programs = [e.triplet.program for e in buffers.entries[kind]]
    distinct = set(programs)
    ops: set[str] = set()
    for program in distinct:
        ops |= world.program_ops(program)
    return {"buffer_size": len(programs), "buffer_distinct_programs": len(distinct),
            "buffer_program_chars": sum(map(len, programs)) / len(programs) if programs else float("nan"),
            "buffer_distinct_ops": len(ops)}
