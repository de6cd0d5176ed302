"""The signals a job may be sent, by name: apart from corral/gateway/job_control.py so that the
CLI's `corral control --help` lists them without importing the service's core."""

SIGNALS = ("HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "CONT", "STOP", "TSTP", "KILL")
"""Signals a job may be sent: the ones programs handle (checkpoint on USR1, ...)."""
