"""The worker inside the sandbox: it reads jobs from the executor, runs each program in a forked child under resource
limits, kills whatever the program left behind, and answers with one outcome per job.

The executor runs this file's text as ``python -s -S -c <text> <config JSON>`` inside the sandbox, where only the
standard library exists (and itself imports only ``descendants`` from it). Messages both ways are a 4-byte
big-endian length and a JSON object. Everything here runs before or around model-written code, never under its
control, except ``run_program``: the forked child's whole life, which never returns.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

# Stateless modules that AZR-style programs import (its prompts' preamble): loaded once here, so a forked child finds
# them ready instead of spending tens of milliseconds on imports. Nothing with hidden state (random, tempfile, uuid)
# may be here: every child would inherit the same generator state.
PRELOADED = ("bisect", "collections", "copy", "functools", "heapq", "itertools", "math", "operator", "re", "string",
             "typing")
# Starting processes and loading native code are refused (PEP 578 audit hooks) and grade the program "forbidden".
# The hook is a grading rule, not the boundary: code that gets around it is still inside the sandbox.
FORBIDDEN_EVENTS = frozenset({"os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.system", "os.unshare",
                              "os.setns", "subprocess.Popen", "ctypes.dlopen"})
FORBIDDEN_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess"})
CHILD_STATUSES = frozenset({"ok", "syntax", "error", "forbidden", "memory", "output", "killed"})
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
MIB = 1 << 20
SWEEP_SECONDS = 2.0  # how long the kill sweep may take before the worker gives up and retires
RESULT_FD = 3


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters, encodable as UTF-8."""
    try:
        line = " ".join(str(text).split())
    except BaseException:  # a hostile __str__
        line = "(unprintable)"
    return line[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line."""
    message = one_line(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode("ascii")
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int) -> dict | None:
    """The next message, or None when the executor closed the channel."""
    header = read_exactly(fd, 4)
    if header is None:
        return None
    body = read_exactly(fd, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


def read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def protect_worker(confined: bool) -> None:
    """Make this process non-dumpable (a program running as the same user cannot ptrace it or open its /proc files).
    Unconfined, where no pid namespace holds the programs, also die with the executor and become a child subreaper,
    so that every process a program leaves stays a descendant of this worker. ctypes is dropped again afterwards, so
    that a program's ``import ctypes`` is a fresh import that the audit hook refuses."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    settings = [(PR_SET_DUMPABLE, 0)] + ([] if confined else [(PR_SET_PDEATHSIG, signal.SIGKILL),
                                                               (PR_SET_CHILD_SUBREAPER, 1)])
    for option, value in settings:
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
    del libc, ctypes
    for name in [name for name in sys.modules if name == "ctypes" or name.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def process_ids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def count_own_tasks() -> int:
    """Tasks (threads) of this real uid that the kernel counts against RLIMIT_NPROC, in this pid namespace's view."""
    uid, count = str(os.getuid()), 0
    for pid in process_ids():
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("Uid:", "Threads:")))
        except (OSError, ValueError):
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields["Threads"])
    return count


def leftovers(confined: bool) -> list[int]:
    """The processes a program left: in the sandbox's pid namespace every process but pid 1 and this worker;
    unconfined, every descendant of this worker (a child subreaper, so orphans and daemons come back to it)."""
    if confined:
        return [pid for pid in process_ids() if pid not in (1, os.getpid())]
    return descendants(os.getpid())


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux's /proc/PID/task/TID/children, walked down)."""
    found, parents = [], [pid]
    while parents:
        parent = parents.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except OSError:
                continue
            found += children
            parents += children
    return found


def kill_leftovers(confined: bool) -> bool:
    """SIGKILL every process the program left until none is left (zombies included: they still count against the
    next program's process limit). False when some survived ``SWEEP_SECONDS``."""
    deadline = time.monotonic() + SWEEP_SECONDS
    while True:
        pids = leftovers(confined)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_children()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def empty_folder(root: str) -> bool:
    """Remove everything the program wrote under ``root`` (its own folder and anything beside it), first giving back
    to the owner the folders it made unreadable. False when something stayed. Runs after the kill sweep, so nothing
    changes under it."""
    try:
        for folder, subfolders, _ in os.walk(root):
            for name in subfolders:
                path = os.path.join(folder, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o700)
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    except OSError:
        return False
    return True


def reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def set_limits(limits: dict, tasks_before: int) -> None:
    cpu = max(1, math.ceil(limits["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later
    memory = limits["memory_mb"] * MIB
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_NPROC, (tasks_before + limits["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * MIB,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def execute(code: str, expression: str) -> dict:
    """exec ``code`` in a fresh namespace, evaluate ``expression`` there: the child's result (status, value, detail)."""
    try:
        program = compile(code, "<program>", "exec", dont_inherit=True)
        call = compile(expression, "<expression>", "eval", dont_inherit=True)
    except MemoryError:
        return {"status": "memory", "detail": "MemoryError while compiling"}
    except (SyntaxError, ValueError, RecursionError, OverflowError) as exc:
        return {"status": "syntax", "detail": describe(exc)}
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(program, namespace)
        return {"status": "ok", "value": repr(eval(call, namespace))}
    except MemoryError:
        return {"status": "memory", "detail": "MemoryError"}
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program's own failure
        return {"status": "error", "detail": describe(exc)}


def run_program(job: dict, limits: dict, workdir: str, tasks_before: int, out_w: int, res_w: int) -> None:
    """The forked child: confine itself, run the job, write the result to ``RESULT_FD`` and exit. Never returns."""
    violations: list[str] = []
    try:
        os.setsid()
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, RESULT_FD)
        os.closerange(RESULT_FD + 1, 1 << 16)  # the executor's channel and every other pipe
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        os.mkdir(workdir, 0o700)
        os.chdir(workdir)
        set_limits(limits, tasks_before)
        if "random" in sys.modules:  # never preloaded; reseeded anyway so that no two children share a stream
            sys.modules["random"].seed()

        def forbid(event: str, args: tuple) -> None:
            if event == "import" and args[0].partition(".")[0] in FORBIDDEN_MODULES:
                event = f"import {args[0]}"
            elif event not in FORBIDDEN_EVENTS:
                return
            violations.append(event)
            raise PermissionError(f"{event} is not allowed in the sandbox")

        sys.addaudithook(forbid)
    except BaseException as exc:
        write_result({"status": "killed", "detail": f"sandbox set-up failed: {describe(exc)}"})
        os._exit(70)
    result = execute(job["code"], job["expression"])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if violations:
        result = {"status": "forbidden", "detail": f"{violations[0]} is not allowed in the sandbox"}
    elif result["status"] == "ok":
        result = check_value(result["value"], limits["output_bytes"]) or result
    write_result(result)
    os._exit(0)


def check_value(text: str, limit: int) -> dict | None:
    """The "output" failure when the value's repr is over ``limit`` bytes or not valid UTF-8, else None."""
    over = {"status": "output", "detail": f"the value's repr is over the limit of {limit} bytes"}
    if len(text) > limit:  # every character is at least one byte: no need to encode a huge repr
        return over
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return {"status": "output", "detail": "the value's repr is not valid UTF-8"}
    return over if size > limit else None


def write_result(result: dict) -> None:
    data = ("\n" + json.dumps(result) + "\n").encode("ascii")
    try:
        while data:
            data = data[os.write(RESULT_FD, data):]
    except OSError:
        pass


class Capped:
    """Bytes read from a pipe, kept up to ``cap``; ``total`` counts them all."""

    def __init__(self, cap: int):
        self.cap, self.total, self.data = cap, 0, bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def over(self) -> bool:
        return self.total > self.cap


def drain(fds: dict[int, Capped], seconds: float) -> None:
    """Read what is left in the pipes until each is at its end or ``seconds`` pass; the pipes stay open."""
    deadline = time.monotonic() + seconds
    open_fds = set(fds)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                fds[fd].add(chunk)
            else:
                open_fds.discard(fd)


def run_job(job: dict, config: dict, number: int, tasks_before: int) -> tuple[dict, bool]:
    """Run one job in a forked child: (the outcome for the executor, whether this worker is still fit for more)."""
    limits, confined = config["limits"], config["confined"]
    workdir = os.path.join(config["root"], f"program-{number}")
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(res_r)
        run_program(job, limits, workdir, tasks_before, out_w, res_w)
    os.close(out_w)
    os.close(res_w)
    output, result = Capped(limits["output_bytes"]), Capped(limits["output_bytes"] + 65536)
    streams = {out_r: output, res_r: result}
    pidfd = os.pidfd_open(pid)
    deadline = start + limits["wall_seconds"]
    exited = timed_out = False
    while not (exited or output.over or result.over):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([pidfd, *streams], [], [], left)
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 1 << 16)
            if chunk:
                streams[fd].add(chunk)
            else:
                del streams[fd]  # the child closed it; the pidfd reports its exit
    os.close(pidfd)
    seconds = time.monotonic() - start
    if not exited:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    clean = kill_leftovers(confined)
    drain(streams, 0.2)
    os.close(out_r)
    os.close(res_r)
    clean = empty_folder(config["root"]) and clean  # else retire: the next worker starts with a fresh folder
    outcome = classify(status, usage, limits, output, result, timed_out)
    outcome["seconds"] = seconds
    return outcome, clean


def classify(status: int, usage, limits: dict, output: Capped, result: Capped, timed_out: bool) -> dict:
    """The outcome of a finished child from its exit status, CPU time, output and result."""
    cpu = usage.ru_utime + usage.ru_stime
    if output.over:
        return {"status": "output", "value": None, "detail": f"more than {limits['output_bytes']} bytes of output"}
    if timed_out:
        return {"status": "timeout", "value": None, "detail": f"wall time over {limits['wall_seconds']} s"}
    signaled = os.WIFSIGNALED(status)
    if signaled and (os.WTERMSIG(status) == signal.SIGXCPU
                     or os.WTERMSIG(status) == signal.SIGKILL and cpu >= limits["cpu_seconds"]):
        return {"status": "timeout", "value": None, "detail": f"CPU time over {limits['cpu_seconds']} s"}
    if result.over:
        return {"status": "output", "value": None, "detail": "the result is over the output limit"}
    try:
        output.data.decode("utf-8")
    except UnicodeDecodeError:
        return {"status": "output", "value": None, "detail": "the program's output is not UTF-8"}
    parsed = parse_result(bytes(result.data))
    if parsed is not None:
        return parsed
    if signaled:
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:  # real-time signals have no name
            name = f"signal {number}"
        return {"status": "killed", "value": None, "detail": f"killed by {name} without a result"}
    return {"status": "killed", "value": None, "detail": f"exited with code {os.WEXITSTATUS(status)} without a result"}


def parse_result(data: bytes) -> dict | None:
    """The child's result from the last line it wrote, or None when there is none or it is not one of ours."""
    try:
        lines = data.decode("ascii").split("\n")
        parsed = json.loads(next(line for line in reversed(lines) if line))
    except (UnicodeDecodeError, StopIteration, ValueError):
        return None
    if (not isinstance(parsed, dict) or parsed.get("status") not in CHILD_STATUSES
            or parsed["status"] == "ok" and not isinstance(parsed.get("value"), str)
            or not isinstance(parsed.get("detail", ""), str)):
        return None
    return {"status": parsed["status"], "value": parsed["value"] if parsed["status"] == "ok" else None,
            "detail": one_line(parsed.get("detail", ""))}


def main() -> None:
    config = json.loads(sys.argv[1])
    channel_in, channel_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # stderr (2) stays: the executor keeps it for start-up errors
    os.close(null)
    if config["uid"] is not None:  # started as root: run as an unprivileged uid of its own, so RLIMIT_NPROC holds
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    protect_worker(config["confined"])
    sys.path[:] = [path for path in sys.path if path]  # never the working folder
    for name in PRELOADED:
        __import__(name)
    os.chdir(config["root"])
    os.close(os.pidfd_open(os.getpid()))  # Linux 5.3 or later: fail here, at start-up, not on the first job
    tasks_before = count_own_tasks() if config["confined"] else 0
    send(channel_out, {"ready": True, "uid": os.getuid(), "processes": tasks_before})
    number = 0
    while True:
        job = receive(channel_in)
        if job is None:
            return
        number += 1
        if not config["confined"] and os.getuid() != 0:  # the user's other tasks count too, and they come and go
            tasks_before = count_own_tasks()  # (the kernel ignores the limit for root)
        outcome, fit = run_job(job, config, number, tasks_before)
        outcome["retire"] = not fit
        send(channel_out, outcome)
        if not fit:
            return


if __name__ == "__main__":
    main()
