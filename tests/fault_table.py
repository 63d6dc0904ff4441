"""Render the fault suites' outcomes (the JSON that a pytest session of
``test_fault_suite.py`` and ``test_real_faults.py`` writes to
``$REDREENTRANT_FAULT_REPORT``, see ``faultkit.py``) as the Markdown tables of
docs/safety.md: one table per group of rows (the module that made them), in the order
the groups first appear.

    python tests/fault_table.py faults.json                        # print the table
    python tests/fault_table.py faults.json --update docs/safety.md  # replace it there

``--update`` replaces what lies between the ``<!-- fault-table:start -->`` and
``<!-- fault-table:end -->`` lines of the file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

START = "<!-- fault-table:start -->"
END = "<!-- fault-table:end -->"

#: what each group of rows (``faultkit.PROCESS_AND_PROXY``, ``faultkit.REAL``) ran
GROUPS = {
    "process and proxy faults": (
        "`tests/test_fault_suite.py`: masters and holders killed, frozen and restarted;"
        " network faults through a loopback TCP proxy; a clock jump stood for by"
        " deleting keys"
    ),
    "real network and clock faults": (
        "`tests/test_real_faults.py`: each client process on a path of its own in a"
        " network namespace (nftables cuts and loss, NFQUEUE delay and jitter), and a"
        " clock shim preloaded into each master (its clocks' rate, jumps of its wall"
        " clock); a rival that saw the masters had tried for the lock before the fault"
    ),
}
HEADER = [
    "| scenario | fault | expected | observed | violations | time to detect loss |",
    "|---|---|---|---|---|---|",
]


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def violations(row: dict[str, Any]) -> str:
    found = row.get("violations") or {}
    if not found:
        return "none"
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(found.items()))


def detect(row: dict[str, Any]) -> str:
    if row.get("detect_ms") is None:
        return "-"
    text = f"{row['detect_ms']:.0f} ms"
    margin = row.get("margin_ms")
    if margin is not None and margin >= 0:
        text += f" ({margin:.0f} ms of validity left)"
    elif margin is not None:
        text += f" after the pause (its validity had ended {-margin:.0f} ms before)"
    return text


def line(row: dict[str, Any]) -> str:
    cells = (
        row["scenario"],
        row["fault"],
        row["expected"],
        row["observed"],
        violations(row),
        detect(row),
    )
    return "| " + " | ".join(cell(x) for x in cells) + " |"


def render(rows: list[dict[str, Any]], server: str) -> str:
    lines = [
        f"Last run: {len(rows)} scenarios, Python {platform.python_version()},"
        f" {server}, 5 masters, lease 1.5 s.",
    ]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("group") or "", []).append(row)
    for group, members in groups.items():
        lines.append("")
        if group:  # rows of a report without groups: one table, as before groups
            about = f"; {GROUPS[group]}" if group in GROUPS else ""
            lines += [f"**{group.capitalize()}** ({len(members)} scenarios{about}).", ""]
        lines += HEADER
        lines += [line(row) for row in members]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--update", type=Path, help="a Markdown file with the markers")
    parser.add_argument("--server", default="redis-server", help="the servers' version")
    args = parser.parse_args(argv)
    rows = json.loads(args.report.read_text(encoding="utf-8"))
    table = render(rows, args.server)
    if args.update is None:
        print(table)
        return 0
    text = args.update.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{args.update}: no {START} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    args.update.write_text(f"{head}{START}\n{table}\n{END}{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
