"""The sandboxed executor: values and typed failures, and a hostile-program suite in which every program is contained,
graded as a failure, and leaves the executor working and the home folder and the repository unchanged."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.execution import STATUSES, ExecutionLimits, Executor, Job, SandboxUnavailable, sandbox_problem
from coevolve.execution.executor import ANSWER_GRACE_SECONDS
from coevolve.execution.worker import descendants

ROOT = Path(__file__).resolve().parents[2]
BWRAP_INSTALL = "apt-get update && apt-get install -y bubblewrap"
SECRET_NAME, SECRET = "COEVOLVE_TEST_SECRET", "s3cret-value-the-sandbox-must-not-see"
LIMITS = ExecutionLimits(cpu_seconds=1, wall_seconds=5, memory_mb=512, processes=8, file_mb=4, open_files=32,
                         output_bytes=64 * 1024)
SKIPPED_IN_SNAPSHOT = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
SENTINEL = Job("def f(x):\n    return x + 1", "f(41)")


def _require_sandbox() -> None:
    problem = sandbox_problem()
    if problem is not None:
        message = f"{problem} (install it with: {BWRAP_INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``folder`` (caches and environments aside): size, mtime and mode."""
    found = {}
    for path, subfolders, files in os.walk(folder):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_IN_SNAPSHOT]
        for name in [*subfolders, *files]:
            stat = os.lstat(os.path.join(path, name))
            found[os.path.join(path, name)] = (stat.st_size, stat.st_mtime_ns, stat.st_mode)
    return found


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    """HOME points at a folder this test made (with a file in it) and a secret is in the environment, both before
    the executor starts, so that its workers would inherit them if they could."""
    folder = tmp_path_factory.mktemp("home")
    (folder / "notes.txt").write_text("mine\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(folder))
        patch.setenv(SECRET_NAME, SECRET)
        yield folder


@pytest.fixture(scope="module")
def executor(home: Path):
    _require_sandbox()
    with Executor(LIMITS, workers=2) as pool:
        yield pool


def test_values_in_job_order(executor: Executor) -> None:
    jobs = [Job("def f(x):\n    return [x, x * x, str(x)]", f"f({i})") for i in range(24)]
    jobs += [Job("from typing import List\nimport math\ndef f(a: List[int]) -> float:\n    return math.fsum(a) / 2",
                 "f([1, 2, 4])"),
             Job("def f(s):\n    return {c: s.count(c) for c in sorted(set(s))}", "f('abca')"),
             Job("print('talks, then answers')\nx = None", "x")]
    outcomes = executor.run(jobs)
    assert [o.value for o in outcomes[:24]] == [repr([i, i * i, str(i)]) for i in range(24)]
    assert [o.value for o in outcomes[24:]] == ["3.5", "{'a': 2, 'b': 1, 'c': 1}", "None"]
    assert all(o.status == "ok" and o.detail == "" and 0 < o.seconds < LIMITS.wall_seconds for o in outcomes)
    assert executor.run([]) == []


def test_exceptions_and_syntax_errors_are_typed(executor: Executor) -> None:
    outcomes = executor.run([
        Job("def f(x):\n    return 1 / x", "f(0)"),
        Job("def f(x):\n    raise ValueError('bad\\ninput')", "f(1)"),
        Job("def f(x)\n    return x", "f(1)"),
        Job("def f(x):\n    return x", "f(1"),
        Job("def f(x):\n  return x\n    return 2", "f(1)"),
        Job("x = 1\0", "x"),
        Job("import sys\nsys.exit(3)", "1"),
        Job("import no_such_module", "1"),
        Job("def f(x):\n    return x", "g(1)"),
    ])
    assert [o.status for o in outcomes] == ["error", "error", "syntax", "syntax", "syntax", "syntax", "error", "error",
                                            "error"]
    assert outcomes[0].detail == "ZeroDivisionError: division by zero"
    assert outcomes[1].detail == "ValueError: bad input"  # one line
    assert outcomes[2].detail.startswith("SyntaxError: ") and outcomes[4].detail.startswith("IndentationError: ")
    assert outcomes[6].detail == "SystemExit: 3"
    assert outcomes[7].detail.startswith("ModuleNotFoundError: ") and outcomes[8].detail.startswith("NameError: ")
    assert all(o.value is None for o in outcomes)


def test_repeated_runs_agree_and_randomness_shows(executor: Executor) -> None:
    """The same program gives the same value on every run and worker (string hashing is seeded alike everywhere),
    while a program that draws random numbers does not, so a determinism check by repeated runs can tell them
    apart."""
    stable = Job("def f(words):\n    return list(set(words)), hash('abc')", "f(['pear', 'fig', 'kiwi', 'plum', 'yam'])")
    random = Job("import random\ndef f():\n    return random.random()", "f()")
    outcomes = executor.run([stable, random] * 6)
    assert len({o.value for o in outcomes[0::2]}) == 1 and outcomes[0].status == "ok"
    assert len({o.value for o in outcomes[1::2]}) == 6


def test_programs_do_not_see_each_others_files(executor: Executor) -> None:
    writer = Job("import os\nopen('mine.txt', 'w').write('a')\nopen('/tmp/shared.txt', 'w').write('b')\n"
                 "os.mkdir('/tmp/locked')\nopen('/tmp/locked/f', 'w').write('c')\nos.chmod('/tmp/locked', 0)", "1")
    reader = Job("import os", "sorted(os.listdir('.')), sorted(os.listdir('/tmp'))")
    assert [o.status for o in executor.run([writer] * 4)] == ["ok"] * 4
    for outcome in executor.run([reader] * 4):
        cwd, tmp = eval(outcome.value)
        assert cwd == [] and len(tmp) == 1 and tmp[0].startswith("program-"), outcome


def test_the_sandbox_shows_no_environment_network_home_or_repository(executor: Executor, home: Path) -> None:
    probe = Job("import os, sys", f"dict(os.environ), os.getuid(), sys.path, sorted(os.listdir('/')), "
                                  f"os.path.exists({str(home)!r}), os.path.exists({str(ROOT)!r})")
    outcome = executor.run([probe])[0]
    environment, uid, path, top, home_seen, repository_seen = eval(outcome.value)
    assert set(environment) <= {"PATH", "LANG", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PWD"}
    assert uid != 0 and not home_seen and not repository_seen
    assert not any("site-packages" in entry for entry in path)
    assert set(top) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "tmp", "proc", "dev", "root",
                        "home", "opt"}


HOSTILE = {
    # name: (code, expression, the statuses it may get)
    "infinite loop": ("while True:\n    pass", "1", {"timeout"}),
    "sleeps past the wall limit": ("import time\ntime.sleep(60)", "1", {"timeout"}),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "1", {"forbidden"}),
    "thread bomb (RLIMIT_NPROC)": ("import threading, time\ndef bomb():\n    while True:\n        try:\n"
                                   "            threading.Thread(target=bomb).start()\n        except RuntimeError:\n"
                                   "            pass\nbomb()", "1", {"timeout"}),
    "10 GB allocation": ("x = bytearray(10 * 2**30)", "1", {"memory"}),
    "10 GB list": ("x = [0] * (10 * 2**30 // 8)", "1", {"memory"}),
    "deep recursion": ("def f(n):\n    return f(n + 1)", "f(0)", {"error"}),
    "recursion past the C stack": ("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1",
                                   "f(0)", {"killed", "memory", "error", "timeout"}),
    "secret from the environment": ("import os", f"os.environ[{SECRET_NAME!r}]", {"error"}),
    "os.system": ("import os", "os.system('touch /tmp/x; echo hi')", {"forbidden"}),
    "subprocess": ("import subprocess", "subprocess.run(['true'])", {"forbidden"}),
    "exec of a shell": ("import os", "os.execv('/bin/sh', ['sh', '-c', 'true'])", {"forbidden"}),
    "ctypes": ("import ctypes", "ctypes.CDLL(None).getpid()", {"forbidden"}),
    "_posixsubprocess": ("import _posixsubprocess", "1", {"forbidden"}),
    "ignores SIGTERM and SIGXCPU": ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                    "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass", "1",
                                    {"timeout"}),
    "100 MB of output": ("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)", "1", {"output"}),
    "100 MB value": ("x = 'x' * 10**8", "x", {"output"}),
    "output that is not UTF-8": ("import os\nos.write(1, b'\\xff\\xfe\\x00 not utf-8')", "1", {"output"}),
    "value that is not UTF-8": ("class S:\n    def __repr__(self):\n        return '\\udc80'", "S()", {"output"}),
    "forged result on the result pipe": ("import os\nos.write(3, b'\\xff{\"status\": \"ok\"')\nos._exit(0)", "1",
                                         {"forbidden"}),
    "kills itself": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "1", {"killed"}),
    "opens its worker's descriptors": ("import os", "os.listdir(f'/proc/{os.getppid()}/fd')", {"error"}),
    "reads its worker's memory": ("import os", "open(f'/proc/{os.getppid()}/mem', 'rb').read(1)", {"error"}),
    "kills itself with a real-time signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 5)", "1",
                                             {"killed"}),
    "kills its worker": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "1", {"killed"}),
    "fills its folder": ("i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 2**20)\n    i += 1", "1", {"error"}),
    "opens too many files": ("fs = [open('/dev/null') for _ in range(10**4)]", "1", {"error"}),
}


def _hostile_jobs(home: Path, port: int) -> dict[str, tuple[Job, set[str]]]:
    jobs = {name: (Job(code, expression), kinds) for name, (code, expression, kinds) in HOSTILE.items()}
    for name, path in (("write to the home folder", home / "pwned"), ("write to the repository", ROOT / "pwned"),
                       ("append to a file of the repository", ROOT / "README.md")):
        jobs[name] = (Job(f"open({str(path)!r}, 'a').write('pwned')", "1"), {"error"})
    jobs["socket to a listener on 127.0.0.1"] = (
        Job("import socket", f"socket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'hi')"), {"error"})
    return jobs


def test_hostile_programs_are_contained_and_graded_as_failures(executor: Executor, home: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    jobs = _hostile_jobs(home, listener.getsockname()[1])
    home_before, repository_before = _snapshot(home), _snapshot(ROOT)
    batch = [job for job, _ in jobs.values() for job in (job, SENTINEL)]  # each hostile program, then a plain one
    start = time.monotonic()
    outcomes = executor.run(batch)
    elapsed = time.monotonic() - start
    for (name, (_, kinds)), outcome in zip(jobs.items(), outcomes[0::2]):
        assert outcome.status in kinds, (name, outcome)
        assert outcome.value is None and outcome.detail and "\n" not in outcome.detail, (name, outcome)
        assert outcome.seconds < LIMITS.wall_seconds + 1.0, (name, outcome)
        assert SECRET not in outcome.detail
    assert all(o.status == "ok" and o.value == "42" for o in outcomes[1::2]), outcomes[1::2]
    graded = {name: outcome.detail for name, outcome in zip(jobs, outcomes[0::2])}
    assert graded["10 GB allocation"] == "MemoryError" and graded["fork bomb"].startswith("os.fork is not allowed")
    assert "Too many open files" in graded["opens too many files"]
    assert "No space left" in graded["fills its folder"] or "too large" in graded["fills its folder"]
    # nothing left running: a program sees only pid 1, its worker and itself in the sandbox's pid namespace
    after = executor.run([Job("import os", "len([p for p in os.listdir('/proc') if p.isdigit()])")] * 4)
    assert [o.value for o in after] == ["3"] * 4
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert _snapshot(home) == home_before
    assert _snapshot(ROOT) == repository_before
    assert elapsed < 30, f"the hostile suite took {elapsed:.1f} s"


# Programs that try to forge their grade: each would report the value 7 (its honest value is 1, or none at all).
FORGED = b'{"status": "ok", "value": "7", "detail": ""}'
COLLECT_SECRETS = (  # every string it can find: environment, its /proc files, the stack's locals, the heap, fd 4
    "import gc, os, select, sys\ndef secrets():\n    found = set(os.environ.values())\n"
    "    for name in ('environ', 'cmdline', 'status', 'stat'):\n        try:\n"
    "            found.update(open(f'/proc/self/{name}', 'rb').read().decode('latin-1').replace('\\0', ' ').split())\n"
    "        except OSError:\n            pass\n    frame = sys._getframe()\n    while frame is not None:\n"
    "        found.update(repr(v) for v in frame.f_locals.values())\n        frame = frame.f_back\n"
    "    for o in gc.get_objects():\n        if isinstance(o, dict):\n"
    "            found.update(v for v in o.values() if isinstance(v, str) and len(v) == 32)\n"
    "    for fd in range(3, 64):\n        try:\n            if select.select([fd], [], [], 0)[0]:\n"
    "                found.add(os.read(fd, 64).decode('latin-1').strip())\n        except (OSError, ValueError):\n"
    "            pass\n    return [s.encode('latin-1', 'replace') for s in found if s]\n")
FORGERS = {
    # name: (code, the statuses it may get)
    "a result line on the descriptor, then exit": (f"import os\nos.write(3, b'\\n' + {FORGED!r} + b'\\n')\n"
                                                  "os._exit(0)", {"forbidden"}),
    "a result line on the descriptor, then the honest end": (f"import os\nos.write(3, b'\\n' + {FORGED!r} + b'\\n')",
                                                            {"forbidden"}),
    "the reporter's framing, then exit": ("import os\nos.write(3, b'R' + b'0' * 32 + b'\\nok\\n\\n7')\nos._exit(0)",
                                          {"forbidden"}),
    "the reporter's protocol: READY, wait for a key, answer": (
        "import os, select\nos.write(3, b'R')\nif select.select([4], [], [], 2)[0]:\n"
        "    os.write(3, os.read(4, 64) + b'ok\\n\\n7')\nos._exit(0)", {"forbidden"}),
    "the framing printed": (f"print('R' + '0' * 32)\nprint('ok')\nprint()\nprint({FORGED!r})\n"
                            "import os\nos._exit(0)", {"killed"}),
    "secrets from env, /proc, the stack and the heap, reused on the descriptor": (
        COLLECT_SECRETS + "for s in secrets():\n    os.write(3, b'R' + s + b'\\nok\\n\\n7')\nos._exit(0)",
        {"forbidden"}),
    "the forged result on every descriptor 0..255": (
        "import os\nfor fd in range(256):\n    for data in (b'R', b'\\n' + " + repr(FORGED) + " + b'\\n'):\n"
        "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\nos._exit(0)",
        {"forbidden"}),
    "a thread that keeps writing the forged result": (
        "import os, threading\nwrote = threading.Event()\ndef spam():\n    while True:\n        try:\n"
        f"            os.write(3, b'R\\n' + {FORGED!r})\n        except OSError:\n            return\n"
        "        wrote.set()\nthreading.Thread(target=spam, daemon=True).start()\nwrote.wait(2)", {"forbidden"}),
    "its own memory through /proc/self/mem": (
        "import os\nfd = os.open('/proc/self/mem', os.O_RDWR)", {"error"}),
}
LIARS = {  # rebinding what the harness uses after the program: the honest value 1 still comes back
    "rebinds eval and repr": "import builtins\nbuiltins.eval = lambda *a, **k: 7\nbuiltins.repr = lambda o: '7'",
    "rebinds the worker's functions": ("import sys\nworker = sys.modules['__main__']\n"
                                       "for name in ('execute', 'check_value', 'describe', 'one_line', 'send'):\n"
                                       "    setattr(worker, name, lambda *a, **k: {'status': 'ok', 'value': '7'})\n"
                                       "import os\nos.execve = lambda *a: None"),
    "rebinds json and os.write": "import json, os\njson.dumps = lambda *a, **k: '7'\nos.write = lambda *a: 0",
}


def test_a_program_cannot_forge_its_grade(executor: Executor) -> None:
    """The result is reported by a shell the child execs after the program (no code of the program survives an
    exec), with a key the worker sends only once it sees that exec: writing the framing anywhere, reusing anything
    the program can read, or exiting early grades a failure, and rebinding what the harness uses changes nothing."""
    honest = "def f(x):\n    return x\n"
    forgers = [Job(honest + code, "f(1)") for code, _ in FORGERS.values()]
    liars = [Job(code + "\n" + honest, "f(1)") for code in LIARS.values()]
    outcomes = executor.run([job for pair in zip(forgers, [SENTINEL] * len(forgers)) for job in pair] + liars)
    for (name, (_, kinds)), outcome in zip(FORGERS.items(), outcomes[0::2]):
        assert outcome.status in kinds and outcome.value is None, (name, outcome)
    assert all(o.status == "ok" and o.value == "42" for o in outcomes[1:2 * len(forgers):2])
    for name, outcome in zip(LIARS, outcomes[2 * len(forgers):]):
        assert outcome.status == "ok" and outcome.value == "1", (name, outcome)
    assert outcomes[0].detail == "wrote to the sandbox's result channel"


def test_results_of_every_size_and_kind_come_back_whole(executor: Executor) -> None:
    """The reporter carries values over the kernel's 128 KiB per argument, any UTF-8, newlines included, and
    failures with their detail; a value it cannot carry (a NUL character) is an "output" failure."""
    big = "x" * (LIMITS.output_bytes - 2)
    outcomes = executor.run([Job(f"x = {big!r}", "x"), Job("x = 'line\\none \\u00e9\\U0001f600'", "x"),
                             Job("class S:\n    def __repr__(self):\n        return 'a\\x00b'", "S()"),
                             Job("x = ''", "x"), Job("raise ValueError('a\\x00b')", "1")])
    assert [o.status for o in outcomes] == ["ok", "ok", "output", "ok", "error"], outcomes
    assert outcomes[0].value == repr(big) and outcomes[1].value == repr("line\none \u00e9\U0001f600")
    assert outcomes[3].value == "''" and outcomes[4].detail == "ValueError: a\\x00b"


def test_a_program_has_at_most_its_processes(executor: Executor) -> None:
    """RLIMIT_NPROC holds even though the tests run as root (the kernel exempts uid 0; the sandbox drops it): a
    program that starts threads (each one a task, as a process is) gets ``processes - 1`` of them beside itself."""
    threads = Job("import threading, time\ndef f(n):\n    started = 0\n    for _ in range(n):\n        try:\n"
                  "            threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
                  "        except RuntimeError:\n            break\n        started += 1\n    return started",
                  "f(50)")
    assert [o.value for o in executor.run([threads] * 2)] == [str(LIMITS.processes - 1)] * 2


# Gets past the audit hook (a grading rule, not the boundary) by giving the hook a code object that does nothing.
# (The replacement needs as many free variables as the hook has.)
DISARM_HOOK = ("import gc, os, time\ndef _disarm():\n    a = b = c = d = None\n    def quiet(event, args):\n"
               "        return (a, b, c, d) and None\n    return quiet\nfor hook in [o for o in gc.get_objects()"
               " if getattr(o, '__name__', '') == 'forbid']:\n"
               "    hook.__code__ = _disarm().__code__\n")


def test_a_fork_bomb_past_the_audit_hook_is_held_and_swept(executor: Executor) -> None:
    """Real processes, not threads: RLIMIT_NPROC stops the forks at ``processes`` (the program included), the sweep
    kills what is left, and the next program finds the sandbox empty."""
    bounded = Job(DISARM_HOOK + "def f():\n    started = 0\n    while True:\n        try:\n"
                  "            pid = os.fork()\n"
                  "        except OSError:\n            return started\n        if pid == 0:\n"
                  "            time.sleep(60)\n            os._exit(0)\n        started += 1", "f()")
    bomb = Job(DISARM_HOOK + "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "1")
    count = Job("import os", "len([p for p in os.listdir('/proc') if p.isdigit()])")
    outcomes = executor.run([bounded, bomb, bounded])
    assert [o.status for o in outcomes] == ["ok", "timeout", "ok"], outcomes
    assert outcomes[0].value == outcomes[2].value == str(LIMITS.processes - 1)
    assert [o.value for o in executor.run([count] * 4)] == ["3"] * 4


def test_no_process_shows_the_secret(executor: Executor) -> None:
    """Neither the worker's nor bubblewrap's own processes carry the caller's environment."""
    scan = Job("import os\ndef f(secret):\n    seen = []\n    for pid in os.listdir('/proc'):\n"
               "        for name in ('environ', 'cmdline'):\n            try:\n"
               "                seen.append(secret.encode() in open(f'/proc/{pid}/{name}', 'rb').read())\n"
               "            except OSError:\n                pass\n    return any(seen), len(seen)",
               f"f({SECRET!r})")
    outcome = executor.run([scan])[0]
    assert outcome.status == "ok" and eval(outcome.value)[0] is False, outcome


def test_the_executor_outlives_its_workers(executor: Executor) -> None:
    killer = Job("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "1")
    outcomes = executor.run([killer, killer, SENTINEL, SENTINEL, killer, SENTINEL])
    assert [o.status for o in outcomes] == ["killed", "killed", "ok", "ok", "killed", "ok"]
    assert outcomes[0].detail == "the sandbox worker died"


def test_a_frozen_worker_is_replaced(home: Path) -> None:
    """A program that stops its worker (SIGSTOP) leaves it unable to answer: after the wall limit and the grace the
    executor kills it, grades the program "killed" and starts another."""
    _require_sandbox()
    limits = ExecutionLimits(cpu_seconds=1, wall_seconds=0.5)
    freezer = Job("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)", "1")
    with Executor(limits, workers=1) as pool:
        start = time.monotonic()
        outcomes = pool.run([freezer, SENTINEL])
        elapsed = time.monotonic() - start
    assert [o.status for o in outcomes] == ["killed", "ok"], outcomes
    assert outcomes[0].detail == "the sandbox worker stopped answering"
    assert elapsed < limits.wall_seconds + ANSWER_GRACE_SECONDS + 5


def test_unconfined_opt_in_runs_programs_in_separate_limited_processes(home: Path) -> None:
    with Executor(LIMITS, workers=1, confinement="none") as pool:
        outcomes = pool.run([SENTINEL, Job("import os", f"os.getpid() != int({os.getpid()})"),
                             Job("while True:\n    pass", "1"), Job("x = bytearray(10 * 2**30)", "1"),
                             Job("import os", f"os.environ[{SECRET_NAME!r}]"), Job("import os", "os.system('true')")])
    assert [o.status for o in outcomes] == ["ok", "ok", "timeout", "memory", "error", "forbidden"]
    assert outcomes[0].value == "42" and outcomes[1].value == "True"


def test_descendants_finds_a_whole_process_tree() -> None:
    """The unconfined worker's sweep and the executor's kill walk this tree (the worker is their subreaper)."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "subprocess.Popen(['sleep', '30']); subprocess.Popen(['sleep', '30'])\n"
                               "print('ready', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "ready\n"
        children = descendants(os.getpid())
        assert parent.pid in children and len(descendants(parent.pid)) == 2
    finally:
        for pid in descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_missing_bubblewrap_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    problem = sandbox_problem()
    assert problem is not None and "\n" not in problem and "bubblewrap (bwrap) is not installed" in problem
    with pytest.raises(SandboxUnavailable) as raised:
        Executor(LIMITS, workers=1)
    assert str(raised.value) == problem
    with Executor(LIMITS, workers=1, confinement="none") as pool:  # the opt-in needs no bwrap
        assert pool.run([SENTINEL])[0].value == "42"


def test_a_bubblewrap_the_kernel_refuses_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bwrap"  # what bwrap says where unprivileged user namespaces are off
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    problem = sandbox_problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith("bubblewrap (bwrap) cannot set up its sandbox here (bwrap: No permissions")
    assert "unprivileged user namespaces look disabled" in problem
    with pytest.raises(SandboxUnavailable, match="No permissions"):
        Executor(LIMITS, workers=1)


def test_a_bubblewrap_that_never_answers_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr("coevolve.execution.executor.START_SECONDS", 0.5)
    problem = sandbox_problem()
    assert problem == f"the sandbox did not start in 0.5 s ({fake} never answered)"
    with pytest.raises(SandboxUnavailable, match="did not start"):
        Executor(LIMITS, workers=1)


def test_close_kills_every_worker(home: Path) -> None:
    _require_sandbox()
    pool = Executor(LIMITS, workers=2)
    processes = [worker.process for worker in pool._slots]
    assert all(process.poll() is None for process in processes)
    pool.close()
    assert all(process.poll() is not None for process in processes)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([SENTINEL])


def test_limits_are_checked() -> None:
    for bad in ({"cpu_seconds": 0}, {"wall_seconds": -1}, {"memory_mb": 32}, {"open_files": 4}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ExecutionLimits(**bad)
    with pytest.raises(ValueError, match="confinement"):
        Executor(LIMITS, confinement="docker")
    assert STATUSES[0] == "ok" and len(STATUSES) == 8
