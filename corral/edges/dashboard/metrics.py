"""What the dashboard shows, for Prometheus: a collector read at each scrape from the
gateway's own state, through the dashboard's read model (corral/gateway/board_reads.py;
docs/grafana-corral.json is built on these and the core's metrics).

Labels stay few and bounded: states, lanes and principal kinds are closed sets; rules
are the policy's; pools and sponsors grow with the facility's people, not with jobs.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.control.metrics import DETAILED
from corral.core.lane_names import FAST
from corral.core.principals import PILOT_PRINCIPAL
from corral.edges.dashboard.board import Board
from corral.gateway.board_reads import BoardReads


class BoardCollector(Collector):
    def __init__(self, board: Board) -> None:
        self.board = board

    def collect(self) -> Iterator[Any]:
        reads = self.board.reads
        yield from self._jobs(reads)
        yield from self._safety(reads)
        yield from self._budgets(reads)
        yield from self._lanes(reads)
        yield from self._notes(reads)

    @staticmethod
    def _jobs(reads: BoardReads) -> Iterator[Any]:
        live = GaugeMetricFamily("corral_jobs", "Jobs not yet ended, by state and lane.", labels=["state", "lane"])
        for state, lane, n in reads.live():
            live.add_metric([state, lane], n)
        yield live
        kinds = reads.kinds()
        counts = reads.submitted()
        by_kind: dict[str, int] = {}
        for (who, _), n in counts.items():
            if who != PILOT_PRINCIPAL:
                by_kind[kinds.get(who, "unknown")] = by_kind.get(kinds.get(who, "unknown"), 0) + n
        submitted = CounterMetricFamily("corral_jobs_submitted", "Jobs submitted, by the kind of principal.",
                                        labels=["kind"])
        for kind, n in sorted(by_kind.items()):
            submitted.add_metric([kind], n)
        yield submitted
        sessions = GaugeMetricFamily("corral_sessions_active", "Sessions with live jobs, by kind.", labels=["kind"])
        for kind, active in reads.live_sessions_by_kind():
            sessions.add_metric([kind], active)
        yield sessions
        yield CounterMetricFamily("corral_fastlane_tasks", "Tasks run in the fast lane.",
                                  value=sum(n for (_, lane), n in counts.items() if lane == FAST))
        yield CounterMetricFamily("corral_fastlane_allocations", "Scheduler jobs that carried fast-lane tasks.",
                                  value=sum(n for (who, _), n in counts.items() if who == PILOT_PRINCIPAL))

    def _safety(self, reads: BoardReads) -> Iterator[Any]:
        reads.tally.refresh()
        decisions = CounterMetricFamily("corral_decisions", "Decisions recorded in the audit log.",
                                        labels=["action", "decision", "rule"])
        for (action, decision, rule), n in sorted(reads.tally.totals().items()):
            decisions.add_metric([action, decision, rule], n)
        yield decisions
        yield GaugeMetricFamily("corral_tainted_credentials", "Token blocks tainted by content flagged as injection.",
                                value=reads.taint_count())
        outbox = GaugeMetricFamily("corral_notify_outbox", "Notifications in the outbox, by state (pending: "
                                   "not delivered yet, retried until it is or is given up).", labels=["state"])
        for state, n in sorted(reads.outbox().items()):
            outbox.add_metric([state], n)
        yield outbox
        audit = self.board.verified
        if audit["records"] is not None:
            yield GaugeMetricFamily("corral_audit_chain_ok", "1 when the audit chain verified intact at its last check.",
                                    value=0 if audit["problems"] else 1)
            yield GaugeMetricFamily("corral_audit_records", "Records in the audit chain at its last check.",
                                    value=audit["records"])

    @staticmethod
    def _budgets(reads: BoardReads) -> Iterator[Any]:
        used = GaugeMetricFamily("corral_budget_cpu_hours", "CPU-hours charged to tokens, by sponsor (one "
                                 "sponsor '(all)' for a scrape without an admin token or the scrape secret).",
                                 labels=["sponsor"])
        by_sponsor: dict[str, float] = {}
        for row in reads.cpu_hours_used():  # each sponsor, at 0 too
            if "/" in row["path"]:  # a narrowed token's use is counted in its root's too
                continue
            by_sponsor[row["sponsor"]] = by_sponsor.get(row["sponsor"], 0.0) + row["cpu_hours"]
        if not DETAILED.get():  # who spends what is not for anyone who can reach the port
            by_sponsor = {"(all)": sum(by_sponsor.values())}
        for sponsor, hours in sorted(by_sponsor.items()):
            used.add_metric([sponsor], hours)
        yield used

    @staticmethod
    def _lanes(reads: BoardReads) -> Iterator[Any]:
        asked = reads.controller_calls()
        commands = CounterMetricFamily("corral_controller_calls", "Scheduler commands corral ran (what the "
                                       "controller and its database were really asked), by command; none on a "
                                       "backend without a controller (local).", labels=["command"])
        for command, n in sorted(asked.items()):
            commands.add_metric([command], n)
        yield commands
        pending = GaugeMetricFamily("corral_fastlane_pool_pending", "Tasks waiting in a fast-lane pool.",
                                    labels=["pool", "cluster"])
        allocs = GaugeMetricFamily("corral_fastlane_pool_allocations", "A fast-lane pool's allocations up.",
                                   labels=["pool", "cluster"])
        for described in reads.lanes():
            for p in described.get("pools", []):
                pending.add_metric([p["pool"], p.get("cluster") or ""], p["pending"])
                allocs.add_metric([p["pool"], p.get("cluster") or ""], sum(1 for a in p["allocations"] if a["up"]))
        yield pending
        yield allocs

    @staticmethod
    def _notes(reads: BoardReads) -> Iterator[Any]:
        index = reads.notes_index()
        if index is not None:
            yield GaugeMetricFamily("corral_notes_embedded", "Notes in memory's semantic index.", value=index.embedded)
            yield GaugeMetricFamily("corral_notes_embedding_backlog",
                                    "Notes written but not embedded yet (recall finds them by words meanwhile).",
                                    value=index.backlog)
