"""aioredlock.errors's public names, from the adapter."""

from redreentrant.compat.aioredlock import (
    AioredlockError,
    LockAcquiringError,
    LockError,
    LockRuntimeError,
)

__all__ = ["AioredlockError", "LockAcquiringError", "LockError", "LockRuntimeError"]
