"""The thread flavour: a driver, socket transport, wake-up hub and watchdog threads over
the core."""
