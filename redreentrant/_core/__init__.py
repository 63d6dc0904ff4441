"""The core: everything that does no I/O (effects, rounds, verdicts, lock kinds, keys,
scripts, holds, owner identity, the fan-out and subscription state machines). The sync
and asyncio flavours drive it; nothing here imports them, redis-py's I/O, threading or
asyncio."""
