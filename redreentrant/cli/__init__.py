"""The ``redreentrant`` command line (also ``python -m redreentrant``).

Commands, one module each::

    redreentrant demo [--quick]                       a guided tour on local masters
    redreentrant run NAME [options] -- CMD ARGS...    a distributed flock(1)
    redreentrant elect NAME [options] -- CMD ARGS...  run CMD while leading (hot standby)
    redreentrant leader NAME [--json] [--watch]       who leads an election
    redreentrant inspect NAME [--json]                what every master holds for NAME
    redreentrant top [PATTERN] [--once | --json]      a live view of the locks and masters
    redreentrant unlock --force NAME                  delete NAME's lock, whoever holds it
    redreentrant fence NAME [--at-least TOKEN]        raise NAME's fencing counters
    redreentrant ensemble up|down|status              local masters for development

Masters come from ``--masters URL,URL,...`` (accepted before or after the command) or
the ``REDREENTRANT_MASTERS`` environment variable, parsed by the library's own parser
(``redreentrant.checks.master_urls``): a bare ``host:port`` means
``redis://host:port/0``, and a malformed entry is a usage error. ``top`` given neither
uses the local ensemble that ``ensemble up`` recorded in its (per-user) state file.

Exit status: 0 on success; 1 when a lock (or leadership) is not obtained, the masters
are unavailable, or a demo check failed (``run`` and ``elect`` with
``--conflict-exit-code N`` make the first two N); 2 for usage errors (bad arguments, no
masters, a malformed master, an empty name); 3 when ``leader`` finds nobody leading;
``run`` and ``elect`` pass their command's status through. Errors are one line on
stderr, starting with ``redreentrant:``.

``run``'s and ``elect``'s command, and the processes ``demo`` starts, die with
``redreentrant`` even when it is killed with SIGKILL (Linux: ``PR_SET_PDEATHSIG``; local
masters: the reaper of :mod:`redreentrant.testing`).

The modules: :mod:`~redreentrant.cli.app` (the parser, the dispatch, exit statuses,
logging), :mod:`~redreentrant.cli.common` (errors, masters, names, signals), and one
per command: :mod:`~redreentrant.cli.run` (whose acquire, child, signals and release
``elect`` reuses), :mod:`~redreentrant.cli.elect`, :mod:`~redreentrant.cli.leader`,
:mod:`~redreentrant.cli.inspect`,
:mod:`~redreentrant.cli.top`, :mod:`~redreentrant.cli.unlock`, :mod:`~redreentrant.cli.fence`,
:mod:`~redreentrant.cli.ensemble`,
:mod:`~redreentrant.cli.demo`. The CLI uses the library through its public names only
(:mod:`redreentrant`, :mod:`redreentrant.checks`, :mod:`redreentrant.testing`; ``top``
lists names with ``mgr.names()``); nothing in the library imports the CLI. ``top``'s
live view needs ``rich`` (the ``cli`` extra); nothing else in the CLI does.
"""

from .app import main

__all__ = ["main"]
