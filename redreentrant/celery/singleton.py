"""Singleton tasks (to be written)."""

from __future__ import annotations

from typing import Any

from celery import Task

from redreentrant import LockError


class DuplicateTaskError(LockError):
    """A singleton task's key is held by another execution."""


class Singleton(Task):  # type: ignore[misc]
    """A task base class: at most one execution per key at a time (to be written)."""


def skipped(value: Any) -> bool:
    """Whether a task's result says it was skipped as a duplicate."""
    return False
