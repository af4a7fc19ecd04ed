"""Runs of the CLI compared with each other (tests/test_distributed.py, tests/test_resume.py,
tests/recipes/test_ttrl.py): the samples, each role's per-step loss and grad norm, final weights and AdamW state; a
run that kills itself mid-step; and a run killed with every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file

COEVOLVE = [sys.executable, "-m", "coevolve"]
# One policy in two roles (Dynamic RL): its diversity rewards give real gradients even with the weak test model.
# 4 questions x 4 solutions, sampled in batches of 8 (one per rank), 2 mini-batches x 2 epochs per step.
DYNAMIC_RL_RUN = ["run", "dynamic_rl", "--quiet", "--set", "steps=3", "--set", "params.n=4", "--set", "params.m=4",
                  "--set", "rollout.batch_size=8", "--set", "rollout.max_new_tokens=32",
                  "--set", "train.micro_batch_size=4", "--set", "train.mini_batch_size=8", "--set", "train.epochs=2",
                  "--set", "eval_sets=[arith_l1]", "--set", "eval_limit=16", "--set", "eval_every=0"]

# What must hold on any CPU: two runs with the same global batch take the same AdamW updates up to float noise. The
# processes sum gradients in another order, so gradients differ by rounding noise, large where a coordinate's
# gradient is a cancellation of large per-sample terms (advantages sum to zero in a group); AdamW divides by the
# gradient's own running size, which turns that noise into weight gaps of a fraction of the step size on those
# coordinates, set by the CPU's kernels (r_zero at lr 1e-3: max gap 2.6e-5 on AMD EPYC, 1.5e-5 on Intel Xeon). So
# the tests bound the gap as a share of how far training moved the weights, which does not depend on the learning
# rate: measured up to 6e-5 (r_zero's solver on AMD EPYC); a gradient share lost, doubled or taken from another
# batch moves the weights differently at order 1. The AdamW moments and the logged grad norms share the bound.
UPDATE_GAP = 1e-3


def launch(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``coevolve ARGS`` in a subprocess on one torch thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*COEVOLVE, *args], capture_output=True, text=True, env=env, timeout=600, **kwargs)


def last_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").iterdir())[-1]


def final_weights(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Each role's weights in the run's last checkpoint."""
    return {f.stem: load_file(f) for f in last_checkpoint(run_dir).glob("*.safetensors")
            if not f.stem.endswith(("optim", "rng"))}


def update_gap(a: Path, b: Path, model_dir: Path) -> float:
    """Largest over roles of |w_b - w_a| / |w_a - w_0| (L2 norms over all the role's weights, w_0 the model's)."""
    start = load_file(Path(model_dir) / "model.safetensors")
    start.setdefault("lm_head.weight", start["model.embed_tokens.weight"])  # tied: checkpoints keep the lm_head name
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    gaps = []
    for role in wa:
        gap = sum(float((wa[role][k] - wb[role][k]).double().square().sum()) for k in wa[role])
        moved = sum(float((wa[role][k] - start[k]).double().square().sum()) for k in wa[role])
        assert moved > 0, f"{role} did not train"
        gaps.append((gap / moved) ** 0.5)
    return max(gaps)


def adam_gap(a: Path, b: Path) -> float:
    """Largest over roles and both AdamW moments of |m_b - m_a| / |m_a| (L2 norms); the step counts must be equal."""
    last_a, last_b = last_checkpoint(a), last_checkpoint(b)
    gaps = []
    for file in sorted(last_a.glob("*.optim.safetensors")):
        sa, sb = load_file(file), load_file(last_b / file.name)
        assert sa.keys() == sb.keys()
        steps = sorted(k for k in sa if k.endswith(".step"))
        assert [float(sa[k]) for k in steps] == [float(sb[k]) for k in steps], f"{file.name}: AdamW step counts"
        for moment in ("exp_avg", "exp_avg_sq"):
            keys = [k for k in sa if k.endswith(f".{moment}")]
            size = sum(float(sa[k].double().square().sum()) for k in keys)
            if size:
                gap = sum(float((sa[k] - sb[k]).double().square().sum()) for k in keys)
                gaps.append((gap / size) ** 0.5)
    assert gaps, "no AdamW state to compare"
    return max(gaps)


def train_rows(run_dir: Path) -> list[dict]:
    """The metrics rows of training steps (evaluation rows left out)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if not any(k.startswith("eval/") for k in r)]


def trained_steps(run_dir: Path, role: str = "policy") -> int:
    """Steps whose update of ``role`` had a non-zero gradient."""
    return sum(1 for r in train_rows(run_dir) if r.get(f"{role}/grad_norm", 0.0) > 0)


def samples(run_dir: Path) -> list[list[str]]:
    return [[json.loads(line)["completion"] for line in f.read_text().splitlines()]
            for f in sorted((run_dir / "samples").glob("*.jsonl"))]


def assert_same_training(a: Path, b: Path, model_dir: Path, series: tuple[str, ...]) -> dict[str, float]:
    """Run ``b`` trained as run ``a``: the same steps, each metric of ``series`` (e.g. ``policy/grad_norm``) at every
    step within UPDATE_GAP of the run's largest value, and weights and AdamW moments within UPDATE_GAP (relative
    gaps). Returns the weight and moment gaps."""
    rows_a, rows_b = train_rows(a), train_rows(b)
    assert [r["step"] for r in rows_b] == [r["step"] for r in rows_a]
    for key in series:
        xa, xb = [r.get(key, 0.0) for r in rows_a], [r.get(key, 0.0) for r in rows_b]
        scale = max(map(abs, xa))
        assert scale > 0, f"{key} is 0 at every step"
        assert all(abs(x - y) <= UPDATE_GAP * scale for x, y in zip(xa, xb)), (key, xa, xb)
    gaps = {"weights": update_gap(a, b, model_dir), "adam": adam_gap(a, b)}
    assert max(gaps.values()) < UPDATE_GAP, gaps
    return gaps


def kill_process_tree(pid: int) -> None:
    """SIGKILL a process and every process under it, each by its id: torchrun starts each rank in a session of its
    own, so killing the launcher's process group leaves the ranks running."""
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    for process in tree:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive, f"still running after SIGKILL: {alive}"


# A run killed mid-step is the uninterrupted run's CLI call with one function wrapped so that the process SIGKILLs
# itself at a fixed point of step 2: deterministic on any machine speed (polling for a checkpoint and killing raced on
# fast CI). The steps after it then train after the resume.
KILL_DRIVER = """
import os, signal, sys
import coevolve.store as store
point = sys.argv.pop(1)
if point == "after_samples":
    original = store.RunStore.write_samples
    def wrapped(self, step, records):
        original(self, step, records)
        if step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    store.RunStore.write_samples = wrapped
else:  # mid_checkpoint: weights of step 2 written, optimizer state not yet
    original = store.save_file
    def wrapped(tensors, path, *args, **kwargs):
        if "/.step_000002." in path:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(tensors, path, *args, **kwargs)
    store.save_file = wrapped
from coevolve.cli import app
sys.argv[0] = "coevolve"
app()
"""


def run_killed(point: str, args: list[str]) -> subprocess.CompletedProcess:
    """``coevolve ARGS`` in a child process that SIGKILLs itself at ``point`` of step 2 (``after_samples``: its
    samples written, its checkpoint not; ``mid_checkpoint``: its weights written, its AdamW state not)."""
    return subprocess.run([sys.executable, "-c", KILL_DRIVER, point, *args], capture_output=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# A run whose sandboxed tool programs of step 2 onward sleep 9 s first (under the tool's 10 s wall limit) inside the
# sandbox, so that a kill from outside lands while one runs; the steps before run as the uninterrupted run's. Before it
# sends the first sleeping batch it creates the file named by its first argument.
SLOW_TOOL_SECONDS = 9
SLOW_TOOL_DRIVER = f"""
import sys
from pathlib import Path
import coevolve.store as store
from coevolve.execution import Executor, Job
marker = Path(sys.argv.pop(1))
written = []
original_samples = store.RunStore.write_samples
def write_samples(self, step, records):
    original_samples(self, step, records)
    written.append(step)
store.RunStore.write_samples = write_samples
original_run = Executor.run
def run(self, jobs):
    if written:
        jobs = [Job("import time\\ntime.sleep({SLOW_TOOL_SECONDS})\\n" + job.code, job.expression) for job in jobs]
        marker.touch()
    return original_run(self, jobs)
Executor.run = run
from coevolve.cli import app
sys.argv[0] = "coevolve"
app()
"""


def running_tool_programs(root: psutil.Process) -> list[psutil.Process]:
    """The programs running in ``root``'s sandboxes: each a child of a sandbox worker (a process under bwrap)."""
    programs = []
    for process in root.children(recursive=True):
        try:
            parent = process.parent()
            grandparent = parent.parent() if parent is not None else None
            if grandparent is not None and grandparent.name() == "bwrap" and parent.name() != "bwrap":
                programs.append(process)
        except psutil.NoSuchProcess:
            pass
    return programs


def still_running(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``seconds`` (a zombie has ended: only its exit status waits
    for whoever reaps it, here a container's init about once a second)."""
    deadline = time.monotonic() + seconds
    while True:
        running = []
        for process in processes:
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def kill_during_tool_call(args: list[str], marker: Path) -> tuple[int, list[psutil.Process], dict[psutil.Process, str]]:
    """``coevolve ARGS`` with :data:`SLOW_TOOL_DRIVER`, its process group SIGKILLed as soon as a tool program of step 2
    runs in its sandbox (``marker`` created, then the run's processes polled every 20 ms). Returns the run's exit code,
    the programs running at the kill, and every process the run had started then (its sandboxes: bwrap, the workers
    and their programs) with its name."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_TOOL_DRIVER, str(marker), *args], stdout=subprocess.DEVNULL,
                                stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        try:
            root = psutil.Process(proc.pid)
            programs: list[psutil.Process] = []
            while proc.poll() is None and not programs:
                time.sleep(0.02)
                programs = running_tool_programs(root) if marker.exists() else []
            if not programs:
                stderr.seek(0)
                raise AssertionError(f"the run ended (exit code {proc.returncode}) without a tool call of step 2: "
                                     f"{stderr.read()[-2000:]!r}")
            started = {}
            for process in root.children(recursive=True):
                try:
                    started[process] = process.name()
                except psutil.NoSuchProcess:
                    pass
            os.killpg(proc.pid, signal.SIGKILL)  # the run's group; the sandboxes sit in sessions of their own
            return proc.wait(timeout=60), programs, started
        finally:
            if proc.poll() is None:
                kill_process_tree(proc.pid)
