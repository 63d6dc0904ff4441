"""The checks redreentrant applies to what it is given, for a program that checks its
input before it makes a manager or a lock (the command line does). Each returns the
value checked, or raises ``ValueError`` (``TypeError`` for a value of the wrong type)
with a message that names it; nothing is sent to Redis.

- :func:`validate_name`: a lock name (any non-empty string that encodes as UTF-8);
- :func:`master_urls`: masters written as one comma-separated string (a URL or a bare
  ``host:port`` each), as URLs;
- :func:`check_lease`: a lease in seconds, ``0 < lease <= MAX_LEASE``;
- :func:`check_permits`: a semaphore's permits, an ``int`` from 1 to
  :data:`MAX_PERMITS`;
- :func:`check_token`: a fencing token, an ``int`` from 0 to :data:`MAX_TOKEN`.
"""

from ._core.fencing import MAX_TOKEN, check_token
from ._core.keys import validate_name
from ._core.settings import MAX_LEASE, MAX_PERMITS, check_lease, check_permits, master_urls

__all__ = [
    "MAX_LEASE",
    "MAX_PERMITS",
    "MAX_TOKEN",
    "check_lease",
    "check_permits",
    "check_token",
    "master_urls",
    "validate_name",
]
