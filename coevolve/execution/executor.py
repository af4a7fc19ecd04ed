"""Run model-written Python programs in a sandbox and get back values or typed failures.

An :class:`Executor` keeps a pool of worker processes, each inside its own bubblewrap sandbox (no network, a read-only
view of only what Python needs, an empty environment, its own pid namespace and an empty writable ``/tmp``). A worker
forks a child per program, applies the limits there, and after the program kills everything it left and empties the
folder, so the programs of a batch never see each other's files. The caller sends source text and gets
:class:`Outcome` rows back: never a process, a path or an exception for anything a program does. ``docs/execution.md``
says what the sandbox isolates and what it does not.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from coevolve.execution.worker import descendants

Status = Literal["ok", "syntax", "error", "forbidden", "timeout", "memory", "output", "killed"]
STATUSES: tuple[str, ...] = ("ok", "syntax", "error", "forbidden", "timeout", "memory", "output", "killed")
Confinement = Literal["bwrap", "none"]

WORKER_SOURCE = Path(__file__).with_name("worker.py")
# Started as root, each worker runs as a uid of its own from this range (no passwd entry needed): the kernel ignores
# RLIMIT_NPROC for uid 0, and a uid per worker keeps one program's processes from counting against another's.
SANDBOX_UID_BASE = 2_000_000_000
START_SECONDS = 30.0  # a worker's start-up, under load
ANSWER_GRACE_SECONDS = 5.0  # beyond the wall limit: the worker's kill sweep, drain and clean-up
MIB = 1 << 20
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
_uid_counter = itertools.count()
log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """The OS sandbox cannot be set up here; the message is one line naming what is missing."""


@dataclass(frozen=True)
class ExecutionLimits:
    """Limits per program. The defaults are sized for AZR-style snippets (a function and one call)."""

    cpu_seconds: float = 5.0  # CPU time (RLIMIT_CPU, whole seconds: SIGXCPU at the limit, SIGKILL a second later)
    wall_seconds: float = 10.0  # from fork to exit; then every process of the program is killed
    memory_mb: int = 1024  # address space (RLIMIT_AS), the interpreter's own ~20 MB included
    processes: int = 8  # tasks at once (RLIMIT_NPROC counts threads), the program itself included
    file_mb: int = 16  # largest file (RLIMIT_FSIZE); in the sandbox also the size of its writable /tmp
    open_files: int = 64  # file descriptors (RLIMIT_NOFILE)
    output_bytes: int = 1 << 20  # printed output, and separately the repr of the value

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"execution limit {name} must be positive, got {value}")
        if self.memory_mb < 64:
            raise ValueError(f"execution limit memory_mb must be at least 64 (the interpreter needs ~20), "
                             f"got {self.memory_mb}")
        if self.open_files < 8:
            raise ValueError(f"execution limit open_files must be at least 8, got {self.open_files}")


@dataclass(frozen=True)
class Job:
    """A program: ``code`` is exec'd in a fresh namespace inside the sandbox, then ``expression`` (built by the
    caller, e.g. ``"f(3, [1, 2])"``) is evaluated there and the repr of its value comes back."""

    code: str
    expression: str


@dataclass(frozen=True)
class Outcome:
    """What one program did. ``status`` is "ok" or the kind of failure: "syntax" (code or expression does not
    compile), "error" (an exception), "forbidden" (it tried to start a process or load native code), "timeout" (CPU
    or wall time), "memory", "output" (too much output or value, or output that is not UTF-8), "killed" (it died
    without a result: a signal, an exit, a crash of its worker)."""

    status: Status
    value: str | None  # repr of the value when status == "ok"
    detail: str  # one line: the exception, or which limit was hit
    seconds: float  # wall time of the program

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@functools.cache
def _bwrap_options(bwrap: str) -> frozenset[str]:
    """The options this bubblewrap knows (``--size`` and ``--disable-userns`` are recent)."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=START_SECONDS).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(word for word in text.split() if word.startswith("--"))


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _read_only_system(python: str) -> list[str]:
    """bwrap arguments for a read-only view of what Python needs: /usr (and the /bin, /lib links into it), the
    loader's cache, the interpreter's prefix with its standard library. Nothing of the home folder but the prefix
    itself where the interpreter lives there, no site-packages, no repository."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.exists("/etc/ld.so.cache"):
        args += [*_parents("/etc/ld.so.cache"), "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.realpath(sys.base_prefix)
    trees = [prefix] + ([os.path.dirname(python)] if not python.startswith(prefix + os.sep) else [])
    for tree in trees:
        if tree != "/usr" and not tree.startswith("/usr/"):
            args += [*_parents(tree), "--ro-bind", tree, tree]
    return args


def _parents(path: str) -> list[str]:
    """bwrap arguments that create the folders above ``path`` with mode 0755 (bwrap's own are 0700 when run as root,
    which the unprivileged sandbox uid could not walk through)."""
    args = []
    for parent in reversed(Path(path).parents[:-1]):
        args += ["--perms", "0755", "--dir", str(parent)]
    return args


def _bwrap_command(bwrap: str, python: str, limits: ExecutionLimits, uid: int | None) -> list[str]:
    """The bwrap command line that starts ``python`` in a fresh sandbox (arguments for Python follow it)."""
    options = _bwrap_options(bwrap)
    command = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in ENVIRONMENT.items():
        command += ["--setenv", name, value]
    if uid is None:  # unprivileged: a user namespace, and none further inside it
        command += ["--unshare-user"] + (["--disable-userns"] if "--disable-userns" in options else [])
    else:  # root: no user namespace (it would map the sandbox to uid 0); the worker drops to ``uid`` itself
        command += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    command += ["--perms", "1777"]
    if "--size" in options:
        command += ["--size", str(limits.file_mb * MIB)]
    command += ["--tmpfs", "/tmp", *_read_only_system(python), "--proc", "/proc"]
    command += _parents("/dev/null")
    for device in ("/dev/null", "/dev/zero", "/dev/urandom"):
        command += ["--dev-bind", device, device]
    return command + ["--chdir", "/tmp", "--remount-ro", "/", python]


def _sandbox_uid() -> int | None:
    """A fresh unprivileged uid for a worker when running as root, else None (the sandbox keeps the user's uid)."""
    if os.geteuid() != 0:
        return None
    return SANDBOX_UID_BASE + (os.getpid() % 100_000) * 1000 + next(_uid_counter) % 1000


def sandbox_problem() -> str | None:
    """None when bubblewrap can confine programs here; otherwise one line saying what is missing. Cheap enough for a
    config check before any model loads: it starts one sandboxed interpreter (tens of milliseconds)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox for model-written code needs Linux (bubblewrap); this is {sys.platform}"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: apt-get install bubblewrap, or opt in explicitly to running "
                "model-written code unconfined")
    uid = _sandbox_uid()
    probe = "import json" if uid is None else f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); " \
                                              "import json"
    command = _bwrap_command(bwrap, _interpreter(), ExecutionLimits(), uid) + ["-s", "-S", "-c", probe]
    try:
        result = subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        return f"the sandbox did not start in {START_SECONDS:g} s ({bwrap} never answered)"
    except OSError as exc:
        return f"bubblewrap (bwrap) did not run: {exc}"
    if result.returncode == 0:
        return None
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    message = lines[-1] if lines else f"exit code {result.returncode}"
    hint = ""
    if "namespace" in message.lower() or "not permitted" in message.lower():
        hint = (": unprivileged user namespaces look disabled (sysctl kernel.unprivileged_userns_clone=1, or "
                "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu)")
    return f"bubblewrap (bwrap) cannot set up its sandbox here ({message}){hint}"


class _Worker:
    """One worker process (inside its sandbox when confined) and the message channel to it."""

    def __init__(self, command: list[str], cwd: str | None, confined: bool):
        self.confined = confined
        self._stderr = tempfile.TemporaryFile()
        self.closed = False  # the worker closed its end of the channel (it died), as against not answering in time
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=self._stderr, env=ENVIRONMENT, cwd=cwd, bufsize=0,
                                            start_new_session=True)
        except OSError as exc:
            self._stderr.close()
            raise SandboxUnavailable(f"the sandbox worker did not start: {exc}") from exc
        assert self.process.stdin is not None and self.process.stdout is not None  # both opened as pipes above
        self._requests, self._answers = self.process.stdin, self.process.stdout  # the message channel's two ends
        hello = self._receive(time.monotonic() + START_SECONDS)
        if hello is None or not hello.get("ready"):
            self.kill()
            raise SandboxUnavailable(f"the sandbox worker did not start: {self.error_line()}")

    def ask(self, payload: bytes, seconds: float) -> dict | None:
        """Send one job; its answer, or None when the worker died or did not answer within ``seconds``."""
        try:
            os.write(self._requests.fileno(), struct.pack(">I", len(payload)) + payload)
        except OSError:
            return None
        return self._receive(time.monotonic() + seconds)

    def alive(self) -> bool:
        return self.process.poll() is None

    def error_line(self) -> str:
        """The last line the worker (or bubblewrap) wrote to stderr."""
        try:
            self._stderr.seek(0)
            lines = [line.strip() for line in self._stderr.read().decode("utf-8", "replace").splitlines()]
        except (OSError, ValueError):
            return "no message"
        lines = [line for line in lines if line]
        return lines[-1][:300] if lines else "no message"

    def kill(self) -> None:
        """SIGKILL the worker: bwrap's --die-with-parent takes its whole pid namespace with it. Unconfined, its
        descendants go first (the worker is their subreaper; once it is gone they would belong to init)."""
        if self.process.poll() is None:
            if not self.confined:
                for pid in descendants(self.process.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self._requests, self._answers, self._stderr):
            try:
                stream.close()
            except OSError:
                pass

    def _receive(self, deadline: float) -> dict | None:
        header = self._read(4, deadline)
        body = None if header is None else self._read(struct.unpack(">I", header)[0], deadline)
        if body is None:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def _read(self, size: int, deadline: float) -> bytes | None:
        fd, chunks = self._answers.fileno(), []
        while size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, size)
            if not chunk:
                self.closed = True
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


def _outcome(answer: dict) -> Outcome:
    """An Outcome from a worker's answer; anything malformed reads as a killed program."""
    status, value, detail, seconds = (answer.get(key) for key in ("status", "value", "detail", "seconds"))
    if (status not in STATUSES or not isinstance(value, (str, type(None))) or not isinstance(detail, str)
            or not isinstance(seconds, (int, float))):
        return Outcome("killed", None, "the sandbox worker answered something unreadable", 0.0)
    return Outcome(status, value if status == "ok" else None, detail, float(seconds))


def _shut_down(slots: list[_Worker | None], threads: ThreadPoolExecutor, root: str | None) -> None:
    threads.shutdown(wait=False, cancel_futures=True)
    for worker in slots:
        if worker is not None:
            worker.kill()
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


class Executor:
    """A pool of sandboxed workers that runs batches of programs; a context manager, and ``close()`` kills every
    process it started.

    ``confinement="bwrap"`` (the default) raises :class:`SandboxUnavailable` at construction when bubblewrap cannot
    set up its sandbox here. ``confinement="none"`` is the explicit opt-in that runs programs unconfined: separate
    processes under the same resource limits, but with the caller's view of the files, the network and the other
    processes (see ``docs/execution.md``).
    """

    def __init__(self, limits: ExecutionLimits = ExecutionLimits(), workers: int | None = None,
                 confinement: Confinement = "bwrap"):
        if confinement not in ("bwrap", "none"):
            raise ValueError(f"confinement must be 'bwrap' or 'none', got {confinement!r}")
        if not sys.platform.startswith("linux"):  # pidfd, /proc, prctl and RLIMIT_NPROC, even unconfined
            raise SandboxUnavailable(f"the executor of model-written code needs Linux; this is {sys.platform}")
        if confinement == "bwrap":
            problem = sandbox_problem()
            if problem is not None:
                raise SandboxUnavailable(problem)
        count = workers if workers is not None else len(os.sched_getaffinity(0))
        if count < 1:
            raise ValueError(f"workers must be at least 1, got {count}")
        self.limits, self.confinement, self.workers = limits, confinement, count
        self._source = WORKER_SOURCE.read_text()
        self._root = tempfile.mkdtemp(prefix="coevolve-exec-") if confinement == "none" else None
        self._slots: list[_Worker | None] = [None] * count
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="coevolve-exec")
        self._finalizer = weakref.finalize(self, _shut_down, self._slots, self._threads, self._root)
        starts = [self._threads.submit(self._start, slot) for slot in range(count)]  # in parallel
        errors = []
        for slot, start in enumerate(starts):
            try:
                self._slots[slot] = start.result()
                self._idle.put(slot)
            except BaseException as exc:  # the others started: kill them too
                errors.append(exc)
        if errors:
            self.close()
            raise errors[0]

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        """Run every job (in parallel over the workers); the outcomes in job order."""
        if not self._finalizer.alive:
            raise RuntimeError("the executor is closed")
        payloads = [json.dumps({"code": job.code, "expression": job.expression}).encode("ascii") for job in jobs]
        futures = [self._threads.submit(self._run_one, payload) for payload in payloads]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Kill every worker (and with it every program) and remove the working folders. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self, slot: int) -> _Worker:
        confined = self.confinement == "bwrap"
        uid = _sandbox_uid() if confined else None
        if confined:
            bwrap = shutil.which("bwrap") or "bwrap"
            prefix, root, cwd = _bwrap_command(bwrap, _interpreter(), self.limits, uid), "/tmp", None
        else:
            assert self._root is not None  # an unconfined executor works in a folder of its own
            root = cwd = os.path.join(self._root, f"worker-{slot}")
            shutil.rmtree(root, ignore_errors=True)
            os.mkdir(root, 0o700)
            prefix = [_interpreter()]
        config = {"uid": uid, "confined": confined, "root": root, "limits": asdict(self.limits)}
        return _Worker([*prefix, "-s", "-S", "-c", self._source, json.dumps(config)], cwd, confined)

    def _replace(self, slot: int) -> _Worker:
        old = self._slots[slot]
        if old is not None:
            old.kill()
        self._slots[slot] = None
        self._slots[slot] = worker = self._start(slot)
        return worker

    def _run_one(self, payload: bytes) -> Outcome:
        slot = self._idle.get()
        try:
            worker = self._slots[slot]
            if worker is None or not worker.alive():  # died between jobs (killed from outside): not this job's fault
                worker = self._replace(slot)
            start = time.monotonic()
            answer = worker.ask(payload, self.limits.wall_seconds + ANSWER_GRACE_SECONDS)
            if answer is None:
                seconds = time.monotonic() - start
                detail = "the sandbox worker died" if worker.closed else "the sandbox worker stopped answering"
                log.warning("%s (its last message: %s); starting another", detail, worker.error_line())
                self._replace(slot)
                return Outcome("killed", None, detail, seconds)
            if answer.get("retire"):  # it could not clean up after this program: a fresh one takes its place
                self._replace(slot)
            return _outcome(answer)
        finally:
            self._idle.put(slot)
