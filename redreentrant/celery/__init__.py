"""Celery on redreentrant's locks (the ``celery`` extra).

- :class:`Singleton`, a task base class: ``@app.task(base=Singleton)`` runs at most one
  execution per key at a time across every worker and host, the hold renewed while
  the task runs and freed within one lease when its worker dies.
- :class:`LeaderScheduler`, a beat scheduler: ``celery beat -S
  redreentrant.celery.LeaderScheduler`` lets any number of beat processes run, and
  only the leader of an election sends due tasks.

The masters come from the app's configuration, ``app.conf.redreentrant_masters`` (a
list of URLs), with ``app.conf.redreentrant_options`` (keyword arguments of
:class:`~redreentrant.LockManager`), or a manager given to the base class.
See docs/celery.md.
"""

from .beat import LeaderScheduler
from .manager import manager_for
from .singleton import DuplicateTaskError, Singleton, skipped

__all__ = ["DuplicateTaskError", "LeaderScheduler", "Singleton", "manager_for", "skipped"]
