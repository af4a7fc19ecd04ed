"""Data: benchmark and corpus files (a registry of sets and their loaders), below tasks and evaluation."""
