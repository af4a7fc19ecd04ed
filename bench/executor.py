"""Throughput of the sandboxed executor (``coevolve/execution``) on AZR-style programs.

- batch: N small programs (a function over lists, strings or numbers and one call, from 8 templates with random
  inputs) through ``Executor.run`` with one worker per CPU: programs per second, median of the timed repeats; and
  the CPU time per program of this process, the workers and their programs, which other load on the machine barely
  changes (CPUs / that = programs per second on idle cores);
- overhead: the same number of trivial programs (``return 1``) through one worker: seconds per program, all of it
  (the parent's message, the fork, the limits, the kill sweep, the clean-up) and the part the worker times (fork to
  exit);
- start: constructing the executor (its workers' sandboxes and interpreters);
- unconfined: the batch with ``confinement="none"``, for what the sandbox costs;
- bwrap per program: the design not taken, one ``bwrap ... python -c`` per program (the same sandbox arguments, one
  per CPU in parallel, no limits set), for what the long-lived forking workers save.

Run from the repository root: ``.venv/bin/python bench/executor.py [--programs N] [--repeats R] [--quick]``.
Writes ``bench/results/executor.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from speed import RESULTS_DIR, machine_info, run_header, warn_if_busy, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevolve.execution import ExecutionLimits, Executor, Job  # noqa: E402
from coevolve.execution.executor import ENVIRONMENT, _bwrap_command, _interpreter, _sandbox_uid  # noqa: E402
from coevolve.execution.worker import descendants  # noqa: E402

TEMPLATES = [
    ("def f(numbers):\n    result = []\n    for i in range(len(numbers)):\n        count = 0\n"
     "        for j in range(len(numbers)):\n            if numbers[j] < numbers[i]:\n                count += 1\n"
     "        result.append(count)\n    return result", lambda r: f"f({[r.randint(0, 99) for _ in range(8)]})"),
    ("from typing import List\n\ndef f(s: str) -> str:\n    return ''.join(sorted(set(s), key=s.index))[::-1]",
     lambda r: f"f({''.join(r.choice('abcdefgh') for _ in range(12))!r})"),
    ("import math\n\ndef f(n):\n    return [math.comb(n, k) for k in range(n + 1)]",
     lambda r: f"f({r.randint(1, 20)})"),
    ("from collections import Counter\n\ndef f(words):\n    c = Counter(words)\n"
     "    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:3]",
     lambda r: f"f({[r.choice(['ab', 'cd', 'ef', 'gh']) for _ in range(10)]})"),
    ("def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     lambda r: f"f({r.randint(5, 90)})"),
    ("def f(d):\n    return {v: k for k, v in sorted(d.items())}",
     lambda r: f"f({dict(zip('abcde', r.sample(range(9), 5)))})"),
    ("import heapq\n\ndef f(xs, k):\n    return heapq.nsmallest(k, xs)",
     lambda r: f"f({r.sample(range(100), 10)}, {r.randint(1, 5)})"),
    ("def f(n):\n    return sum(i * i for i in range(n) if i % 3)", lambda r: f"f({r.randint(10, 1000)})"),
]
TRIVIAL = Job("def f():\n    return 1", "f()")


def programs(count: int, seed: int = 0) -> list[Job]:
    rng = random.Random(seed)
    return [Job(code, call(rng)) for code, call in (TEMPLATES[i % len(TEMPLATES)] for i in range(count))]


def timed_batches(executor: Executor, jobs: list[Job], repeats: int) -> tuple[list[float], float, list]:
    """Seconds of each timed run of the whole batch (after one untimed run), CPU seconds per program over the timed
    runs, and the last run's outcomes."""
    executor.run(jobs)
    times, outcomes, cpu_start = [], [], cpu_seconds(executor)
    for _ in range(repeats):
        start = time.perf_counter()
        outcomes = executor.run(jobs)
        times.append(time.perf_counter() - start)
    return times, (cpu_seconds(executor) - cpu_start) / (repeats * len(jobs)), outcomes


def cpu_seconds(executor: Executor) -> float:
    """CPU time so far of this process and of the executor's workers with their reaped programs (``/proc``'s utime,
    stime, cutime and cstime): what a batch costs, whatever else shares the cores."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total, tick = usage.ru_utime + usage.ru_stime, os.sysconf("SC_CLK_TCK")
    for worker in executor._slots:
        for pid in [worker.process.pid, *descendants(worker.process.pid)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(value) for value in fields[11:15]) / tick
    return total


def bwrap_per_program(jobs: list[Job], workers: int) -> tuple[float, float]:
    """Seconds for ``jobs`` with a fresh bwrap and interpreter per program, ``workers`` at a time, and the CPU
    seconds per program (this process's and the reaped bwraps' with everything below them)."""
    uid = _sandbox_uid()
    drop = "" if uid is None else f"os.setgroups([]); os.setgid({uid}); os.setuid({uid}); "
    prefix = _bwrap_command(shutil.which("bwrap"), _interpreter(), ExecutionLimits(), uid) + ["-s", "-S", "-c"]

    def one(job: Job) -> float:
        """Run one program; the interpreter's own CPU seconds, which it reports (the kernel does not add what runs
        in the sandbox's pid namespace to bwrap's children's time)."""
        runner = (f"import os, resource; {drop}ns = {{}}; exec({job.code!r}, ns); "
                  f"print(repr(eval({job.expression!r}, ns))); u = resource.getrusage(resource.RUSAGE_SELF); "
                  "print(u.ru_utime + u.ru_stime)")
        result = subprocess.run(prefix + [runner], env=ENVIRONMENT, check=True, capture_output=True, text=True)
        return float(result.stdout.split()[-1])

    def cpu() -> float:
        return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                             resource.RUSAGE_CHILDREN)))

    start, cpu_start = time.perf_counter(), cpu()
    with ThreadPoolExecutor(workers) as pool:
        interpreters = sum(pool.map(one, jobs))
    return time.perf_counter() - start, (cpu() - cpu_start + interpreters) / len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-program-bwraps", type=int, default=64, help="programs for the bwrap-per-program row")
    parser.add_argument("--quick", action="store_true", help="32 programs, 2 repeats: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "executor.json")
    args = parser.parse_args()
    if args.quick:
        args.programs, args.repeats, args.per_program_bwraps = 32, 2, 8
    warn_if_busy()
    machine = machine_info()
    workers = len(os.sched_getaffinity(0))
    jobs = programs(args.programs)
    limits = ExecutionLimits()
    results: dict = {"programs": args.programs, "repeats": args.repeats, "workers": workers,
                     "limits": limits.__dict__}

    start = time.perf_counter()
    executor = Executor(limits, workers=workers)
    results["start_seconds"] = time.perf_counter() - start
    with executor:
        times, cpu, outcomes = timed_batches(executor, jobs, args.repeats)
        statuses = sorted({o.status for o in outcomes})
        if statuses != ["ok"]:
            raise SystemExit(f"the benchmark programs should all run: {statuses}")
        results["batch_seconds"] = times
        results["programs_per_second"] = args.programs / statistics.median(times)
        results["cpu_seconds_per_program"] = cpu
        results["programs_per_second_on_idle_cores"] = workers / cpu
        results["worker_seconds_per_program_median"] = statistics.median(o.seconds for o in outcomes)
    with Executor(limits, workers=1) as single:
        times, cpu, outcomes = timed_batches(single, [TRIVIAL] * args.programs, args.repeats)
        results["overhead_seconds_per_program"] = statistics.median(times) / args.programs
        results["overhead_cpu_seconds_per_program"] = cpu
        results["overhead_worker_seconds_median"] = statistics.median(o.seconds for o in outcomes)
    with Executor(limits, workers=workers, confinement="none") as unconfined:
        times, cpu, _ = timed_batches(unconfined, jobs, args.repeats)
        results["unconfined_programs_per_second"] = args.programs / statistics.median(times)
        results["unconfined_cpu_seconds_per_program"] = cpu
    seconds, cpu = bwrap_per_program(jobs[:args.per_program_bwraps], workers)
    results["bwrap_per_program_programs_per_second"] = args.per_program_bwraps / seconds
    results["bwrap_per_program_cpu_seconds_per_program"] = cpu

    machine["load_avg_end"] = list(os.getloadavg())
    write_json(args.out, {**run_header(), "machine": machine, **results})
    print(f"{'figure':<52} value")
    print(f"{'executor start (' + str(workers) + ' workers)':<52} {results['start_seconds']:.2f} s")
    print(f"{'batch of ' + str(args.programs) + ' AZR-style programs':<52} "
          f"{results['programs_per_second']:.0f} programs/s ({statistics.median(results['batch_seconds']):.2f} s)")
    print(f"{'  per program, fork to exit (median)':<52} {1000 * results['worker_seconds_per_program_median']:.1f} ms")
    print(f"{'  CPU per program (executor, worker, program)':<52} {1000 * results['cpu_seconds_per_program']:.1f} ms "
          f"= {results['programs_per_second_on_idle_cores']:.0f} programs/s on {workers} idle cores")
    print(f"{'overhead per trivial program, one worker':<52} {1000 * results['overhead_seconds_per_program']:.1f} ms "
          f"(fork to exit {1000 * results['overhead_worker_seconds_median']:.1f} ms, "
          f"CPU {1000 * results['overhead_cpu_seconds_per_program']:.1f} ms)")
    print(f"{'unconfined (confinement=none)':<52} {results['unconfined_programs_per_second']:.0f} programs/s "
          f"(CPU {1000 * results['unconfined_cpu_seconds_per_program']:.1f} ms per program)")
    print(f"{'bwrap + interpreter per program (not taken)':<52} "
          f"{results['bwrap_per_program_programs_per_second']:.0f} programs/s "
          f"(CPU {1000 * results['bwrap_per_program_cpu_seconds_per_program']:.1f} ms per program)")
    print(f"load average {machine['load_avg_1_5_15'][0]:.2f} at start, {machine['load_avg_end'][0]:.2f} at end; "
          f"wrote {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
