"""Task worlds: prompts, parsers, generators and data loaders."""

from coevolve.tasks import arith, program  # noqa: F401  (register their evaluation sets)
