"""The asyncio flavour: a driver, transport, wake-up hub and watchdog tasks over the
core."""
