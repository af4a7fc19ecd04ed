"""The sandboxed executor of model-written programs (floor 1: it imports nothing from coevolve above it).

Recipes hand it source text and get values or typed failures back, never a process or a path::

    with Executor(ExecutionLimits(cpu_seconds=2)) as executor:
        outcomes = executor.run([Job("def f(x):\\n    return x * 2", "f(21)")])   # [Outcome("ok", "42", ...)]
"""

from coevolve.execution.executor import (
    STATUSES,
    ExecutionLimits,
    Executor,
    Job,
    Outcome,
    SandboxUnavailable,
    Status,
    sandbox_problem,
)

__all__ = ["STATUSES", "ExecutionLimits", "Executor", "Job", "Outcome", "SandboxUnavailable", "Status",
           "sandbox_problem"]
