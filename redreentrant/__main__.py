"""``python -m redreentrant``: the command line (see :mod:`redreentrant.cli`)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
