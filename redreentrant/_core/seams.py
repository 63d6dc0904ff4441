"""The seams between the core and a flavour, as typed protocols.

A flavour's driver carries out the core's effects with a *transport* (fan-out rounds)
and a *hub* (wake-ups). Anything that has these methods will do: the socket transports
of :mod:`redreentrant._sync` and :mod:`redreentrant._async`, or the in-memory
:class:`~redreentrant._core.mock.MockTransport` of the tests.
"""

from __future__ import annotations

from typing import Protocol

from .effects import Fanout, Handover, Notify, Reply


class Transport(Protocol):
    """Runs one fan-out round: ``calls[i]`` on master ``i``, all at once."""

    def fanout(self, fanout: Fanout) -> list[list[Reply]]: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """The asyncio twin of :class:`Transport`."""

    async def fanout(self, fanout: Fanout) -> list[list[Reply]]: ...

    async def close(self) -> None: ...


class Hub(Protocol):
    """Wake-ups: waiters on release channels (see :mod:`.subscriptions`), and waiting."""

    def watch(
        self,
        channel: str,
        owner: str,
        broadcast: bool = False,
        targeted: bool = False,
        log: bool = False,
    ) -> int: ...

    def unwatch(self, channel: str, owner: str) -> None: ...

    def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int: ...

    def pause(self, seconds: float) -> None: ...

    def notify(self, notice: Notify) -> None: ...

    def handed(self, channel: str, owner: str) -> Handover | None: ...

    def messages(self, channel: str, owner: str) -> list[tuple[int, str]]: ...

    def relay(self, channel: str, owner: str) -> None: ...

    def close(self) -> None: ...


class AsyncHub(Protocol):
    """The asyncio twin of :class:`Hub`."""

    async def watch(
        self,
        channel: str,
        owner: str,
        broadcast: bool = False,
        targeted: bool = False,
        log: bool = False,
    ) -> int: ...

    def unwatch(self, channel: str, owner: str) -> None: ...

    async def wait(self, channel: str, owner: str, generation: int, timeout: float) -> int: ...

    async def pause(self, seconds: float) -> None: ...

    def notify(self, notice: Notify) -> None: ...

    def handed(self, channel: str, owner: str) -> Handover | None: ...

    def messages(self, channel: str, owner: str) -> list[tuple[int, str]]: ...

    def relay(self, channel: str, owner: str) -> None: ...

    async def close(self) -> None: ...
