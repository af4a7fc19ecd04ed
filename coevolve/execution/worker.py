"""The worker inside the sandbox: it reads jobs from the executor, runs each program in a forked child under resource
limits, kills whatever the program left behind, and answers with one outcome per job.

The executor runs this file's text as ``python -s -S -c <text> <config JSON>`` inside the sandbox, where only the
standard library exists (and itself imports only ``descendants`` from it). Messages both ways are a 4-byte
big-endian length and a JSON object. Everything here runs before or around model-written code, never under its
control, except ``run_program``: the forked child's whole life, which never returns.

A program cannot forge its result. The child never writes one while the program's code can still run: it execs a
shell (``REPORT_SCRIPT``) with the result as arguments, and the shell writes ``READY`` to ``RESULT_FD``; the worker
then checks that the child's ``/proc/PID/exe`` is that shell (so no Python, no thread, no handler of the program is
left), sends a key drawn after the fork on ``KEY_FD``, and accepts only ``READY``, the key and one result, in that
order. Bytes a program writes to the channel grade it ``forbidden``; a program that exits early has no result.
"""

from __future__ import annotations

import builtins
import fcntl
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
TAMPERED = {"status": "forbidden", "value": None, "detail": "wrote to the sandbox's result channel"}
CHILD_STATUSES = frozenset({"ok", "syntax", "error", "forbidden", "memory", "output", "killed"})
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
MIB = 1 << 20
SWEEP_SECONDS = 2.0  # how long the kill sweep may take before the worker gives up and retires
RESULT_FD, KEY_FD = 3, 4  # in the child: the result channel to the worker, and the key the worker sends the reporter
READY = b"R"
# The reporter, a shell the child execs with its result as arguments (status, detail, then the value's UTF-8 in chunks
# under the kernel's 128 KiB per argument): it says READY, reads the key the worker sends once it has seen the exec,
# and writes the key, the status, the detail and the value.
REPORT_SCRIPT = ("printf R >&3 && IFS= read -r key <&4 "
                 "&& printf '%s\\n%s\\n%s\\n' \"$key\" \"$1\" \"$2\" >&3 && shift 2 && printf '%s' \"$@\" >&3")
ARGUMENT_CHUNK = 100_000


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
    """exec ``code`` in a fresh namespace, evaluate ``expression`` there: the child's result (status, value, detail).
    What it uses after the program starts is bound first (see ``run_program``)."""
    evaluate, represent, explain, memory_error, any_error = eval, repr, describe, MemoryError, BaseException
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
        return {"status": "ok", "value": represent(evaluate(call, namespace))}
    except memory_error:
        return {"status": "memory", "detail": "MemoryError"}
    except any_error as exc:  # SystemExit and KeyboardInterrupt included: the program's own failure
        return {"status": "error", "detail": explain(exc)}


def run_program(job: dict, limits: dict, workdir: str, tasks_before: int, fds: tuple[int, int, int],
                reporter: str) -> None:
    """The forked child: confine itself, run the job and exec the reporter with its result. Never returns.

    A program can rebind the builtins, module attributes and this module's globals, so everything used once it has
    started is bound to a local here first: a running function's locals are out of its reach. ``fds`` are the ends of
    the output pipe, the result pipe and the key pipe."""
    execve, exit_now, any_error, check, run = os.execve, os._exit, BaseException, check_value, execute
    get_limit, set_limit, stack_limit = resource.getrlimit, resource.setrlimit, resource.RLIMIT_STACK
    script, chunk, flushes = REPORT_SCRIPT, ARGUMENT_CHUNK, (sys.stdout.flush, sys.stderr.flush)
    forbidden_events, forbidden_modules = FORBIDDEN_EVENTS, FORBIDDEN_MODULES
    violations: list[str] = []
    reporting = False

    def report(status: str, detail: str = "", value: str | None = None) -> None:
        """Exec the reporter shell with the result as its arguments; never returns."""
        nonlocal reporting
        reporting = True  # the one exec the audit hook lets through
        try:
            data = value.encode("utf-8") if value is not None else b""
        except any_error:
            status, detail, data = "output", "the value's repr is not valid UTF-8", b""
        arguments: tuple[str | bytes, ...] = (reporter, "-c", script, "report", status, detail.replace("\0", "\\x00"))
        while data:
            arguments, data = arguments + (data[:chunk],), data[chunk:]
        try:
            soft, hard = get_limit(stack_limit)
            set_limit(stack_limit, (hard, hard))  # the kernel allows arguments up to a quarter of the stack limit
            execve(reporter, arguments, {})
        except any_error:
            pass
        try:
            execve(reporter, (reporter, "-c", script, "report", "output", "the value's repr cannot be reported (a NUL "
                              "character, or over the kernel's limit on arguments)"), {})
        finally:
            exit_now(70)

    try:
        os.setsid()
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in fds]  # above every target, then onto them
        for source, targets in zip(moved, ((1, 2), (RESULT_FD,), (KEY_FD,))):
            for target in targets:
                os.dup2(source, target)
        os.closerange(KEY_FD + 1, 1 << 16)  # the executor's channel and every other pipe
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        os.mkdir(workdir, 0o700)
        os.chdir(workdir)
        set_limits(limits, tasks_before)
        if "random" in sys.modules:  # never preloaded; reseeded anyway so that no two children share a stream
            sys.modules["random"].seed()

        def forbid(event: str, args: tuple) -> None:
            if event == "import" and args[0].partition(".")[0] in forbidden_modules:
                event = f"import {args[0]}"
            elif event not in forbidden_events or event == "os.exec" and reporting:
                return
            violations.append(event)
            raise PermissionError(f"{event} is not allowed in the sandbox")

        sys.addaudithook(forbid)
    except BaseException as exc:
        report("killed", f"sandbox set-up failed: {describe(exc)}")
    try:
        result = run(job["code"], job["expression"])
    except any_error:  # the program broke a function of this module that it could reach
        result = {"status": "killed", "detail": "the program disrupted its own grading"}
    for flush in flushes:
        try:
            flush()
        except any_error:
            pass
    if violations:
        report("forbidden", f"{violations[0]} is not allowed in the sandbox")
    if result["status"] == "ok":
        over = check(result["value"], limits["output_bytes"])
        if over is not None:
            report(over["status"], over["detail"])
        report("ok", "", result["value"])
    report(result["status"], result["detail"])


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
    limits, confined, reporter = config["limits"], config["confined"], config["reporter"]
    workdir = os.path.join(config["root"], f"program-{number}")
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    key_r, key_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_r)
            os.close(res_r)
            os.close(key_w)
            run_program(job, limits, workdir, tasks_before, (out_w, res_w, key_r), reporter)
        finally:
            os._exit(70)
    os.close(out_w)
    os.close(res_w)
    os.close(key_r)
    key = os.urandom(16).hex().encode("ascii")  # drawn after the fork: the child's memory never held it
    output, result = Capped(limits["output_bytes"]), Capped(limits["output_bytes"] + 65536)
    streams = {out_r: output, res_r: result}
    pidfd = os.pidfd_open(pid)
    deadline = start + limits["wall_seconds"]
    exited = timed_out = tampered = key_sent = False
    while not (exited or tampered or output.over or result.over):
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
            if not chunk:
                del streams[fd]  # the child closed it; the pidfd reports its exit
                continue
            streams[fd].add(chunk)
            if fd == res_r and not key_sent:  # the first bytes of a result: only the reporter may write them
                tampered = result.data[:1] != READY or not runs(pid, reporter)
                if not tampered:
                    send_key(key_w, key)
                    key_sent = True
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
    for fd in (out_r, res_r, key_w):
        os.close(fd)
    clean = empty_folder(config["root"]) and clean  # else retire: the next worker starts with a fresh folder
    outcome = TAMPERED if tampered else classify(status, usage, limits, output, result, timed_out, key)
    outcome = {**outcome, "seconds": seconds}
    return outcome, clean


def runs(pid: int, executable: str) -> bool:
    """Whether process ``pid`` now runs ``executable`` (its ``/proc/PID/exe``; unreadable while it is the forked,
    non-dumpable interpreter, and a program cannot point it anywhere without an exec)."""
    try:
        return os.readlink(f"/proc/{pid}/exe") == executable
    except OSError:
        return False


def send_key(fd: int, key: bytes) -> None:
    try:
        os.write(fd, key + b"\n")
    except OSError:  # the reporter died
        pass


def classify(status: int, usage, limits: dict, output: Capped, result: Capped, timed_out: bool, key: bytes) -> dict:
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
    parsed = parse_result(bytes(result.data), key, limits["output_bytes"])
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


def parse_result(data: bytes, key: bytes, limit: int) -> dict | None:
    """The reporter's result: READY, the key, the status, the detail, then the value. None when there is none or it
    stops short; TAMPERED when anything else is on the channel."""
    head = READY + key + b"\n"
    if not data.startswith(head):
        return None if head.startswith(data) else TAMPERED
    fields = data[len(head):].split(b"\n", 2)
    if len(fields) < 3:
        return None
    status, detail, value = fields[0].decode("ascii", "replace"), fields[1].decode("utf-8", "replace"), fields[2]
    if status not in CHILD_STATUSES:
        return TAMPERED
    if status != "ok":
        return {"status": status, "value": None, "detail": one_line(detail)}
    if len(value) > limit:
        return {"status": "output", "value": None, "detail": f"the value's repr is over the limit of {limit} bytes"}
    try:
        return {"status": "ok", "value": value.decode("utf-8"), "detail": ""}
    except UnicodeDecodeError:
        return {"status": "output", "value": None, "detail": "the value's repr is not valid UTF-8"}


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
    config["reporter"] = os.path.realpath("/bin/sh")  # what a child execs to report (see the module's docstring)
    if not os.access(config["reporter"], os.X_OK):
        raise SystemExit("the sandbox has no /bin/sh, which reports each program's result")
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
