"""Small helpers the test files share."""

from __future__ import annotations

from typing import Any


def records(out: Any) -> list[dict[str, Any]]:
    """A recipe step's sample rows (``StepOutput.samples``) as the JSON records the run store writes."""
    return [row.as_record() for row in out.samples]
