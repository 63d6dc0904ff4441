"""aioredlock.lock's public names, from the adapter."""

from redreentrant.compat.aioredlock import Lock

__all__ = ["Lock"]
