"""redlock-py's module name for its own tests: the adapter, redreentrant.compat.redlock."""

from redreentrant.compat.redlock import (
    CannotObtainLock,
    Lock,
    MultipleRedlockException,
    Redlock,
)

__all__ = ["CannotObtainLock", "Lock", "MultipleRedlockException", "Redlock"]
