"""aioredlock's package name for its own tests: the adapter, redreentrant.compat.aioredlock."""

from redreentrant.compat.aioredlock import (
    Aioredlock,
    Lock,
    LockAcquiringError,
    LockError,
    LockRuntimeError,
    Sentinel,
)

__all__ = (
    "Aioredlock",
    "Lock",
    "LockAcquiringError",
    "LockError",
    "LockRuntimeError",
    "Sentinel",
)
