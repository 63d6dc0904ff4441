"""aioredlock.algorithm's public names, from the adapter."""

from redreentrant.compat.aioredlock import Aioredlock, Lock, LockError

__all__ = ["Aioredlock", "Lock", "LockError"]
