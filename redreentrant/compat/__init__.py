"""Drop-in adapters for the Python Redis locks programs already use: switching is an
import change.

Each module has one library's names, constructor signatures, return values and
exceptions, and behaves as that library does wherever a program could tell (an adapter
is not reentrant where its library is not), and as redreentrant does where the library
is unsafe (quorum judgement, validity on a monotonic clock, waiting without polling,
undo on failure):

- :mod:`redreentrant.compat.redis_py`: redis-py's ``Lock`` and ``AsyncLock``
  (``r.lock(name, lock_class=Lock)``);
- :mod:`redreentrant.compat.pottery`: pottery's ``Redlock``, ``AIORedlock``,
  ``synchronize``;
- :mod:`redreentrant.compat.redis_lock`: python-redis-lock's ``Lock``, ``reset_all``;
- :mod:`redreentrant.compat.aioredlock`: aioredlock's ``Aioredlock``, ``Lock``;
- :mod:`redreentrant.compat.redlock`: redlock-py's ``Redlock``.

Adapter objects share one :class:`~redreentrant.LockManager` per set of masters
(:mod:`redreentrant.compat.managers`): no manager, thread or connection pool is made
per lock object. The libraries' keys are not used: an adapter's lock and the library's
own lock of the same name do not exclude each other (switch every user at once).
"""
