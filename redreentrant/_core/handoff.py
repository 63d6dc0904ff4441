"""A hold handed off between owners, in any process: the ticket that carries it.

``Lock.hand_off()`` takes a hold off its owner here (the watchdog stops renewing it;
the masters keep it until its lease ends) and returns a ticket, a short JSON text;
``Lock.take_over(ticket)``, by any owner of any manager on the same masters, moves the
hold to that owner in one round (``lua/extend.lua``), with its own manager's lease
renewed by its watchdog. The ticket names the hold exactly (its owner id and the tag
of the try that made it), so it is taken over once at most, and never after the hold
expired or was released.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

#: the ticket format's version (a field of every ticket)
VERSION = 1


@dataclass(frozen=True)
class Ticket:
    """What travels with a hold handed off."""

    #: the lock's name and kind (its label)
    name: str
    kind: str
    #: the owner id that holds it on the masters, and the tag of its hold there
    owner: str
    tag: int
    #: its hold count (reentrancy depth), kept by the new owner
    count: int
    #: the fencing token of its grant (None: taken without fencing)
    token: int | None

    def encode(self) -> str:
        return json.dumps({"v": VERSION, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Ticket:
        """The ticket ``text`` encodes; ``ValueError`` if it is not one."""
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict) or fields.pop("v", None) != VERSION:
                raise ValueError("not a ticket of this version")
            ticket = cls(**fields)
        except (TypeError, ValueError) as error:
            raise ValueError(f"not a hand-off ticket: {text!r:.200}") from error
        ints = (ticket.tag, ticket.count) + (() if ticket.token is None else (ticket.token,))
        if not (
            all(type(f) is str for f in (ticket.name, ticket.kind, ticket.owner))
            and all(type(n) is int for n in ints)
            and ticket.count >= 1
        ):
            raise ValueError(f"not a hand-off ticket: {text!r:.200}")
        return ticket
