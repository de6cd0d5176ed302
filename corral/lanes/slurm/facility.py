"""What the Slurm lane's facility offers and what a job used: partitions and their
limits (``scontrol show partition/node``, cached until slurm.conf changes), the refusal
of what can never run (preflight), the cores free now, Slurm's own start estimate
(``sbatch --test-only``), the facility's node types and QOS, and a finished job's CPU
time and peak memory from accounting."""

from __future__ import annotations

import re
import time
from typing import Any, Iterable, Sequence

from corral.core import proc
from corral.core.errors import CorralError
from corral.core.jobs import JobSpec
from corral.lanes.backend import Partition, Usage
from corral.lanes.fits import refuse_misfits
from corral.lanes.slurm.base import SlurmBase
from corral.lanes.slurm.tiers import WALLTIME_LABEL
from corral.lanes.slurm.vocab import expand_nodes, min_job_age_s, parse_kv, parse_slurm_time


def _members(partition: dict[str, str], nodes: Iterable[str]) -> list[str]:
    """The nodes of a partition (its ``scontrol show partition`` line): all of them when
    its Nodes= names none of them (``ALL``)."""
    names, listed = list(nodes), expand_nodes(partition.get("Nodes", ""))
    return [n for n in names if n in listed] or names



_SIZE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def _rss_mb(text: str) -> float | None:
    """sacct's MaxRSS ('204800K', '1.50G', '0') -> MB."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)([KMGT]?)\s*$", text or "")
    return float(m.group(1)) * _SIZE_MB.get(m.group(2) or "K", 1 / 1024) if m else None


def _cpu_s(text: str) -> float | None:
    """sacct's TotalCPU ('00:01.234', '01:02:03', '1-02:03:04') -> seconds."""
    m = re.match(r"^\s*(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)\s*$", text or "")
    if not m:
        return None
    d, h, mi, sec = m.groups()
    return int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + float(sec)


class Facility(SlurmBase):
    def usage(self, backend_id: str) -> Usage:
        """From accounting (slurmdbd, not the controller): the job's CPU time, and the
        largest MaxRSS of its steps (the batch step is the work; jobacct_gather samples)."""
        text = self._run("sacct", "-n", "-P", "-j", backend_id, "-o", "JobID,TotalCPU,MaxRSS")
        cpu, rss = None, None
        for line in text.splitlines():
            jid, total, maxrss = (line.split("|") + ["", ""])[:3]
            if jid == backend_id:
                cpu = _cpu_s(total)
            got = _rss_mb(maxrss)
            if got is not None and (rss is None or got > rss):
                rss = got
        return Usage(cpu, rss, "sacct TotalCPU and MaxRSS (sampled by jobacct_gather)")

    def cpu_seconds_many(self, backend_ids: Sequence[str]) -> dict[str, float]:
        """The CPU seconds each RUNNING job used so far, over all its steps (the batch step
        and its srun's: AveCPU times NTasks), from jobacct_gather's samples through one
        ``sstat`` per hundred jobs (the idle check, corral/notify/idle.py). A job sstat
        cannot read (ended, not yet sampled, another user's to an unprivileged gateway) is left out."""
        out: dict[str, float] = {}
        wanted = set(backend_ids)
        ids = sorted(wanted)
        for i in range(0, len(ids), 100):
            text = self._run("sstat", "-a", "-n", "-P", "-j", ",".join(ids[i:i + 100]),
                             "--format=JobID,AveCPU,NTasks")
            for line in text.splitlines():
                jid, ave, ntasks = (line.split("|") + ["", ""])[:3]
                job, cpu = jid.split(".")[0], _cpu_s(ave)
                if job in wanted and cpu is not None:
                    out[job] = out.get(job, 0.0) + cpu * (int(ntasks) if ntasks.strip().isdigit() else 1)
        return out

    def free(self, partition: str | None) -> tuple[int, int] | None:
        """From the nodes' allocations now, asked of scontrol: nodes down, drained or not
        responding have none free."""
        parts = [parse_kv(p) for p in self._run("scontrol", "show", "partition", "-o").splitlines()]
        part = next((p for p in parts if (p.get("PartitionName") == partition if partition
                                          else p.get("Default") == "YES")), {})
        nodes = {kv.get("NodeName", ""): kv for kv in map(parse_kv, self._run("scontrol", "show", "node", "-o").splitlines())}
        best: tuple[int, int] | None = None
        for kv in (nodes[n] for n in _members(part, nodes)):
            if any(s in kv.get("State", "") for s in ("DOWN", "DRAIN", "NOT_RESPONDING", "FAIL")):
                continue
            room = (int(kv.get("CPUTot", 0)) - int(kv.get("CPUAlloc", 0)),
                    int(kv.get("RealMemory", 0)) - int(kv.get("AllocMem", 0)))
            best = room if best is None or room > best else best
        return best

    def estimate_start(self, spec: JobSpec) -> float | None:
        """``sbatch --test-only`` with the job's resources: Slurm's own answer (one RPC),
        'Job N to start at 2026-12-01T21:05:11 ...' in the controller's local time."""
        return self.test_only(spec)[0]

    def test_only(self, spec: JobSpec) -> tuple[float | None, str]:
        """``estimate_start`` with what Slurm said when it gave no start (a controller
        down, a QOS or account limit): -> (start or None, Slurm's last line)."""
        walltime_s = int(spec.labels.get(WALLTIME_LABEL) or spec.walltime_s)  # as it would be sent
        argv = ["sbatch", "--test-only", "--nodes=1", "--ntasks=1", f"--cpus-per-task={spec.cpus}",
                f"--mem={spec.memory_mb}M", f"--time={max(1, -(-walltime_s // 60))}", "--wrap=true"]
        if spec.partition:
            argv.append(f"--partition={spec.partition}")
        if spec.gpus:
            argv.append(f"--gres=gpu:{spec.gpus}")
        self._counted(argv)
        r = proc.run(argv, env=self._env(), inherit_env=False, timeout=self.timeout_s, check=False)
        said = (r.stderr or "") + (r.stdout or "")
        m = re.search(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", said)
        if m:
            return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")), ""
        return None, (said.strip().splitlines() or [f"sbatch --test-only exited {r.returncode}"])[-1][:300]

    def partitions(self) -> list[Partition]:
        """Read once, cached; re-read when slurm.conf changes (mtime and size)."""
        key = self.conf_key()
        if self._limits is None or (key != self._limits_key and not self._given_limits):
            self._limits = self._read_limits()
            self._limits_key = key
        return self._limits

    def _read_limits(self) -> list[Partition]:
        nodes = {}
        for line in self._run("scontrol", "show", "node", "-o").splitlines():
            kv = parse_kv(line)
            gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", kv.get("Gres", "")))
            nodes[kv.get("NodeName", "")] = (int(kv.get("CPUTot", 0)), int(kv.get("RealMemory", 0)), gpus)
        parts = []
        for line in self._run("scontrol", "show", "partition", "-o").splitlines():
            kv = parse_kv(line)
            members = _members(kv, nodes)
            cpus = max((nodes[n][0] for n in members), default=0)
            mem = max((nodes[n][1] for n in members), default=0)
            gpus = max((nodes[n][2] for n in members), default=0)
            max_t = parse_slurm_time(kv.get("MaxTime", "")) or 365 * 86400
            parts.append(Partition(kv["PartitionName"], cpus, mem, gpus, max_t, default=kv.get("Default") == "YES",
                                   extra={"state": kv.get("State"), "nodes": sorted(members),
                                          # what --mem=0 (all of a node's memory) is sure to get on any of them
                                          "min_memory_mb": min((nodes[n][1] for n in members), default=0),
                                          # sinfo's allocated: a node whose CPUs the caller's jobs take all of
                                          "node_cpus": {n: nodes[n][0] for n in sorted(members)},
                                          "min_job_age_s": min_job_age_s(self.slurm_conf)}))
        return parts

    def facts(self) -> dict[str, Any]:
        """Node types (CPUs, memory, gres, features; counted) and QOS limits, for the
        facility facts. The QOS part needs slurmdbd; without it, it is None."""
        types: dict[tuple[int, int, str, str], int] = {}
        for line in self._run("scontrol", "show", "node", "-o").splitlines():
            kv = parse_kv(line)
            key = (int(kv.get("CPUTot", 0)), int(kv.get("RealMemory", 0)), kv.get("Gres", "(null)"),
                   kv.get("AvailableFeatures", "(null)"))
            types[key] = types.get(key, 0) + 1
        nodes = [{"count": n, "cpus": c, "memory_mb": m, "gres": g, "features": f} for (c, m, g, f), n in types.items()]
        qos: list[dict[str, str]] | None
        try:
            out = self._run("sacctmgr", "-n", "-P", "show", "qos", "format=Name,Priority,MaxWall,MaxTRESPU,MaxJobsPU")
            qos = [dict(zip(("name", "priority", "max_wall", "max_tres_per_user", "max_jobs_per_user"), ln.split("|"),
                            strict=False)) for ln in out.splitlines() if ln.strip()]
        except CorralError:
            qos = None
        return {"node_types": nodes, "qos": qos}

    def preflight(self, spec: JobSpec) -> None:
        """Refuse at once what no partition can ever run: every problem, each with the
        nearest valid value (corral/lanes/fits.py)."""
        refuse_misfits(spec, self.partitions())
