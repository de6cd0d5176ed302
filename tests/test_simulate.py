"""The facility simulator: validated against AccaSim on a real trace, reproducible,
its policies behaving as they claim, its controller model calibrated on the private
Slurm, and its command's errors in the caller's terms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench._accasim import run_accasim, write_clean_swf
from bench._common import shared_data
from corral.simulate import scenario
from corral.simulate.cluster import one_pool
from corral.simulate.engine import Engine, SchedConfig
from corral.simulate.workload import AgentModel, PeopleModel, SimJob, swf_jobs

from .slurm_env import slurm_conf

LUBLIN = shared_data("traces") / "lublin_256.swf"


def _engine(path: Path, cores: int, algorithm: str) -> Engine:
    e = Engine(one_pool(cores), SchedConfig(algorithm, 0), record_starts=True)
    e.run(swf_jobs(path, one_pool(cores)))
    return e


def _ours(path: Path, cores: int, algorithm: str) -> dict[int, float]:
    starts = _engine(path, cores, algorithm).starts
    assert starts is not None
    return starts


@pytest.fixture(scope="module")
def lublin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[SimJob], int]:
    out = tmp_path_factory.mktemp("trace") / "lublin-1500.swf"
    jobs, cores = write_clean_swf(LUBLIN, out, 1500)
    return out, jobs, cores


@pytest.mark.parametrize("algorithm", ["fcfs", "accasim-easy"])
def test_start_times_are_accasims_to_the_second(lublin: tuple[Path, list[SimJob], int], algorithm: str) -> None:
    path, jobs, cores = lublin
    theirs, _ = run_accasim(path, cores, algorithm)
    ours = _ours(path, cores, algorithm)
    assert len(theirs) == len(jobs) == len(ours)
    differ = [j.id for j in jobs if theirs[j.id] != ours[j.id]]
    assert differ == [], f"{len(differ)} jobs start at other times, first {differ[:5]}"


def test_easy_backfills_without_delaying_the_head(lublin: tuple[Path, list[SimJob], int]) -> None:
    """EASY's promise: a job that became the blocked head starts no later than the
    reservation it got then (jobs end at or before their limits, so a reservation can
    only come early). It waits far less than FCFS on a loaded trace, never starts a job
    before it was submitted, and is not AccaSim's variant (which breaks that promise)."""
    path, jobs, cores = lublin
    e = _engine(path, cores, "easy")
    assert e.starts is not None and e.reserved
    late = [i for i, t in e.reserved.items() if e.starts[i] > t]
    assert late == [], f"{len(late)} heads started after their reservation"
    easy = e.starts
    fcfs, acc = (_ours(path, cores, a) for a in ("fcfs", "accasim-easy"))
    by_id = {j.id: j for j in jobs}
    assert all(easy[i] >= by_id[i].submit for i in easy)
    mean = {name: sum(s[j.id] - j.submit for j in jobs) / len(jobs) for name, s in
            (("easy", easy), ("fcfs", fcfs), ("acc", acc))}
    assert mean["easy"] < mean["fcfs"] / 2
    assert easy != acc


def test_resources_are_never_oversubscribed() -> None:
    cores = 64
    jobs = [SimJob(i, float(i * 10), float(100 + (i * 37) % 400), float(600), 1 + (i * 13) % 48) for i in range(1, 400)]
    e = Engine(one_pool(cores), SchedConfig("easy", 0), record_starts=True)
    low = [cores]
    e.on_start = lambda j: low.append(e.parts[0].free_c)
    e.run(iter(jobs))
    assert min(low) >= 0 and e.parts[0].free_c == cores and len(e.starts or {}) == len(jobs)


def _small(seed: int = 3, share: float = 0.3) -> scenario.Scenario:
    return scenario.build(None, "small", 2, seed, AgentModel(share=share), PeopleModel(people=60),
                          SchedConfig("easy", 30, 200))


def test_same_seed_same_report_and_policies_do_what_they_claim() -> None:
    a = scenario.compare(_small())
    b = scenario.compare(_small())

    def same(r: dict) -> str:  # all but how long this machine took
        return json.dumps({k: {x: y for x, y in f.items() if x not in ("wall_s", "jobs_per_s")}
                           for k, f in r["policies"].items()}, sort_keys=True, default=str)

    assert same(a) == same(b) and a["scenario"] == b["scenario"]
    assert json.dumps(scenario.compare(_small(seed=4))["policies"]["plain"]["counts"]) != \
        json.dumps(a["policies"]["plain"]["counts"])
    p, c, ban = (a["policies"][k] for k in ("plain", "corral", "ban"))
    assert p["counts"]["people_jobs"] == c["counts"]["people_jobs"] == ban["counts"]["people_jobs"] > 0
    assert ban["agents"] == 0 and ban["counts"]["agent_jobs"] == 0
    assert p["agents"] == c["agents"] > 0
    # one shared view: over the people's own queries (the ban's), corral adds its one poll
    # every slurm.poll_s (10 s), whatever the agents do; the agents polling add more
    def queries(f: dict) -> int:
        return f["controller"]["rpcs"]["query"] + f["controller"]["rpcs"]["query_one"]

    people_q = queries(ban)
    gateway_q = 2 * 86400 / 10
    assert queries(c) - people_q < gateway_q * 1.3
    assert queries(p) - people_q > (queries(c) - people_q) * 1.5
    # tiny jobs went to the fast lane, repeats to the cache, and nothing of that to sbatch
    assert c["counts"]["fast_tasks"] > 0 and c["counts"]["cache_hits"] > 0 and c["counts"]["pilots"] > 0
    assert c["controller"]["rpcs"]["submit"] < p["controller"]["rpcs"]["submit"] + c["counts"]["pilots"]
    assert p["counts"]["fast_tasks"] == 0 and p["counts"]["cache_hits"] == 0
    assert c["agent_loop_short_s"]["p50"] < p["agent_loop_short_s"]["p50"]


def test_the_controller_slows_down_under_a_polling_storm() -> None:
    """Many agents polling every 2 s load the modelled slurmctld: its busy share and
    command latency rise with the agents; through corral they stay flat."""
    few = scenario.compare(_small(share=0.1), ("plain",))["policies"]["plain"]["controller"]
    many_sc = scenario.build(None, "small", 2, 3, AgentModel(share=0.6, poll_s=0.2), PeopleModel(people=60),
                             SchedConfig("easy", 30, 200))
    many = scenario.compare(many_sc, ("plain", "corral"))["policies"]
    assert many["plain"]["controller"]["utilisation"] > few["utilisation"] * 5
    assert many["plain"]["controller"]["people_command_latency_s"]["mean"] > few["people_command_latency_s"]["mean"]
    assert many["corral"]["controller"]["utilisation"] < many["plain"]["controller"]["utilisation"] / 5


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.cli", "simulate", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "150"})


def test_command_reports_in_three_forms(tmp_path: Path) -> None:
    page = tmp_path / "sim.html"
    r = _cli("--facility", "small", "--days", "1", "--people", "40", "--sweep", "0.1,0.4", "--html", str(page),
             "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["policies"]) == {"plain", "corral", "ban"}
    assert [row["share"] for row in out["sweep"]] == [0.1, 0.1, 0.4, 0.4]
    text = page.read_text()
    assert text.count("<svg") >= 6 and "<script" not in text and "http" not in text.split("<body>")[1]
    table = _cli("--trace", str(LUBLIN), "--scheduler", "fcfs", "--policies", "ban")
    assert table.returncode == 0 and "people's wait p50" in table.stdout


@pytest.mark.parametrize("args,says", [
    (["--days", "0"], "--days must be above 0"),
    (["--trace", "/no/such.swf"], "does not exist"),
    (["--policies", "plain,nope"], "unknown policy nope"),
    (["--agent-share", "1.2"], "--agent-share must be"),
    (["--facility", "/no/such.toml"], "neither a preset nor a file"),
    (["--sweep", "0.1,x"], "not a list of shares"),
    (["--agent-tier", "3"], "--agent-tier must be 0"),
    (["--corral-without", "fast,wings"], "unknown part of corral wings"),
])
def test_bad_input_is_refused_in_the_callers_terms(args: list[str], says: str) -> None:
    r = _cli(*args, "--json")
    assert r.returncode == 2
    assert says in json.loads(r.stdout)["error"]["message"]
    assert "Traceback" not in r.stderr


def test_unsorted_trace_is_refused_with_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("1 100 -1 10 4 -1 -1 4 60 -1 1 1 1 -1 1 0 -1 -1\n2 50 -1 10 4 -1 -1 4 60 -1 1 1 1 -1 1 0 -1 -1\n")
    r = _cli("--trace", str(bad), "--json")
    assert r.returncode == 2 and "bad.swf:2" in json.loads(r.stdout)["error"]["message"]


@pytest.mark.usefixtures("slurm_turn")
def test_calibration_reads_the_real_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the private Slurm: sdiag read, service times positive, and the file it
    writes is what the model loads."""
    conf = slurm_conf()
    from corral.simulate import calibrate

    monkeypatch.setenv("SLURM_CONF", conf)
    result = calibrate.calibrate(queries=20, held=20, clients=2, burst_s=1.0, say=lambda s: None)
    assert 0 < result["submit_s"] < 1 and 0 < result["query_base_s"] < 1 and result["threads_effective"] >= 1
    out = calibrate.write(result, tmp_path / "cal.json")
    from corral.simulate.controlplane import ServiceTimes

    assert ServiceTimes.load(out).submit_s == result["submit_s"]


def test_corral_without_its_parts_is_the_plain_arm_and_each_part_counts() -> None:
    """The ablation's wiring: corral with every part off runs exactly as agents do
    outside it; with only the nice off, people wait longer than with all of corral."""
    from corral.simulate.policies import PARTS, Run

    def run(policy: str, off: frozenset[str] = frozenset()) -> dict:
        sc = scenario.build(None, "small", 2, 3, AgentModel(share=0.4), PeopleModel(people=60, load=0.8),
                            SchedConfig("easy", 30, 200), corral_off=off)
        f = Run(sc, policy).go()
        return {k: v for k, v in f.items() if k not in ("policy", "wall_s", "jobs_per_s")}

    assert run("corral", PARTS) == run("plain")
    whole, no_view = run("corral"), run("corral", frozenset({"view"}))
    assert no_view["controller"]["rpcs"]["query_one"] > 0 == whole["controller"]["rpcs"]["query_one"]
    assert run("corral", frozenset({"fast"}))["counts"]["fast_tasks"] == 0 < whole["counts"]["fast_tasks"]
    assert run("corral", frozenset({"cache"}))["counts"]["cache_hits"] == 0 < whole["counts"]["cache_hits"]


def test_the_facilitys_cedar_policy_decides_on_the_simulated_clock(tmp_path: Path) -> None:
    """A rule that keeps agents' jobs to nights and weekends refuses what agents submit
    in office hours of simulated time, and lets the rest run."""
    from corral.safety.policy import DEFAULT_POLICY
    from corral.simulate.policies import Run

    nights = tmp_path / "nights.cedar"
    nights.write_text(DEFAULT_POLICY.read_text() + '''
@id("agents-at-night")
forbid (principal is Corral::Agent, action == Corral::Action::"submit", resource)
when { !context.off_hours };
''')
    counts = {}
    for name, cedar in (("default", None), ("nights", nights)):
        sc = scenario.build(None, "small", 3, 5, AgentModel(share=0.4), PeopleModel(people=60),
                            SchedConfig("easy", 30, 200), cedar=cedar)
        counts[name] = Run(sc, "corral").go()["counts"]
    n = counts["nights"]
    assert n["refused"] > 0 and n["fast_tasks"] + n["batch_agent_jobs"] > 0
    assert counts["default"]["refused"] < n["refused"]


def test_a_job_beyond_its_partition_is_rejected_not_queued_forever() -> None:
    fac = one_pool(8)
    jobs = [SimJob(1, 0.0, 10.0, 10.0, 16), SimJob(2, 0.0, 10.0, fac.default.max_walltime_h * 3600 + 1, 2),
            SimJob(3, 0.0, 10.0, 20.0, 8)]
    e = Engine(fac, SchedConfig("easy", 0), record_starts=True)
    e.run(iter(jobs))
    assert e.rejected == 2 and e.starts == {3: 0.0}
