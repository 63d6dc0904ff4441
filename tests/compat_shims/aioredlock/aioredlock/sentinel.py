"""aioredlock.sentinel's public name, from the adapter (which takes no Sentinel)."""

from redreentrant.compat.aioredlock import Sentinel

__all__ = ["Sentinel"]
