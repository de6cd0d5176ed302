"""Containment: the bwrap sandbox, its host, the system-call filter, egress, and opening a workdir as the job."""
