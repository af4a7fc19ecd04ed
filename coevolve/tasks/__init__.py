"""Task worlds: prompts, parsers, generators and data loaders."""

from coevolve.tasks import arith  # noqa: F401  (registers the arith evaluation sets)
