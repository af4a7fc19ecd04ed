"""``python -m coevolve``: the command line (what ``coevolve run --processes N`` starts on each rank)."""

from coevolve.cli import app

app()
