"""Where the compute nodes reach this machine (the gateway's host): the address the fast
lane's scheduler listens on for its workers. Its name, unless that name means loopback
here (as /etc/hosts often says, and on the private cluster, docs/decisions/0032): then
the address this machine reaches the Slurm controller from, which the nodes reach too."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from pathlib import Path


def this_host() -> str:
    name = socket.getfqdn()
    if _loopback(name):
        for ctl in controller_hosts(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")):
            addr = _address_toward(ctl)
            if addr and not _loopback(addr):
                return addr
    return name


def controller_hosts(slurm_conf: str | None) -> list[str]:
    """slurm.conf's SlurmctldHost entries in order (primary, backups): each one's address
    where given (`ctl1(10.0.0.1)`), else its name."""
    try:
        text = Path(slurm_conf).read_text(errors="replace") if slurm_conf else ""
    except OSError:
        text = ""
    return [m.group(2) or m.group(1)
            for m in re.finditer(r"(?im)^\s*SlurmctldHost\s*=\s*([^\s(#]+)(?:\(([^)\s]+)\))?", text)]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _address_toward(host: str) -> str | None:
    """This machine's address on the route to ``host`` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None
