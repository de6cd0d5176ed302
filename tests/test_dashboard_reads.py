"""The dashboard reads through the declared verbs, or the read model the gateway keeps for
it (corral/gateway/board_reads.py), never the service's raw parts (issue 53 item 4): before,
corral/edges/dashboard reached into ``service.db``, ``.lanes``, ``.audit`` and the like 24
times (and imported the lanes twice), so a change of the store's or a lane's insides broke a page no test of theirs read.
Read from the source with ``ast``: the scan needs no gateway."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "corral" / "edges" / "dashboard"

EDGE_OWN = {"authenticate", "signin", "metrics"}
"""What the dashboard may ask of the service itself: who a token is, the one-time sign-in
links, and the registry its /metrics collector joins. The edge's own work, not state it reads."""
RAW = ("corral.core.store", "corral.core.db", "corral.lanes")
"""Packages whose objects the dashboard must not import: the store and the lanes."""


def _is_service(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "service") or (
        isinstance(node, ast.Attribute) and node.attr == "service")


def reaches(source: str) -> list[str]:
    """Each raw reach in ``source``: ``service.<part>`` beyond the edge's own, a reach
    behind the read model (its ``_s``), an import of the store or the lanes."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_service(node.value) and node.attr not in EDGE_OWN:
            found.append((node.lineno, f"service.{node.attr}"))
        elif isinstance(node, ast.Attribute) and node.attr == "_s":
            found.append((node.lineno, "the read model's service (._s)"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(RAW):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith(RAW)]
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_scan_finds_the_reaches_it_forbids() -> None:
    before = """
from corral.lanes.registry import FAST
import corral.core.store.read
class History:
    def plots(self, service):
        rows = self.service.db.read.spans(0, None)
        cap = self.board.service.lanes.batch.backend.partitions()
        head = service.audit.log
        deep = self.reads._s.gate.store
        caller = service.authenticate(token)
        service.metrics.registry.register(None)
"""
    assert reaches(before) == ["2: from corral.lanes.registry import ...", "3: import corral.core.store.read",
                               "6: service.db", "7: service.lanes", "8: service.audit",
                               "9: the read model's service (._s)"]


def test_the_dashboard_reaches_into_no_raw_part_of_the_service() -> None:
    found = {p.name: reaches(p.read_text()) for p in sorted(DASHBOARD.glob("*.py"))}
    assert len(found) >= 6, sorted(found)
    assert not {k: v for k, v in found.items() if v}, (
        "the dashboard reads through the declared verbs (corral/edges/reads.py) or through "
        f"corral/gateway/board_reads.py, not the service's parts: {found}")
