"""Evaluation: benchmark loaders, accuracy metrics and the evaluation harness."""

from coevolve.data.benchmarks import (
    BENCHMARKS,
    DATA_DIR_ENV,
    Benchmark,
    BenchmarkDataNotFound,
    EvalItem,
    available_sets,
    get_benchmark,
    load_benchmark,
    subset,
)
from coevolve.evaluation.harness import EVAL_PRESETS, EvalPreset, evaluate
from coevolve.evaluation.metrics import accuracy, avg_at_k, mean_pass_at_k, pass_at_k

__all__ = [
    "BENCHMARKS",
    "DATA_DIR_ENV",
    "EVAL_PRESETS",
    "Benchmark",
    "BenchmarkDataNotFound",
    "EvalItem",
    "EvalPreset",
    "accuracy",
    "available_sets",
    "avg_at_k",
    "evaluate",
    "get_benchmark",
    "load_benchmark",
    "mean_pass_at_k",
    "pass_at_k",
    "subset",
]
