"""coevolve: a generator writes questions, a solver learns to answer them."""

__version__ = "0.1.0"
