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
    # the fast lane's gain is under contention: half the users agents and a busier machine,
    # so that each median is of about a hundred short jobs (at 30% agents, of about ten)
    busy = scenario.build(None, "small", 2, 3, AgentModel(share=0.5), PeopleModel(people=60, load=0.8),
                          SchedConfig("easy", 30, 200))
    b = scenario.compare(busy, ("plain", "corral"))["policies"]
    assert min(f["agent_loop_short_s"]["n"] for f in b.values()) > 50
    assert b["corral"]["agent_loop_short_s"]["p50"] < b["plain"]["agent_loop_short_s"]["p50"]


def test_the_gateway_polls_only_while_it_has_jobs_in_slurm() -> None:
    """As the reconciler and the Slurm backend do: no jobs of corral's in Slurm, no
    squeue; so a gateway without agents costs the controller exactly what people do."""
    sc = scenario.build(None, "small", 1, 3, AgentModel(share=0.0), PeopleModel(people=40),
                        SchedConfig("easy", 30, 200))
    r = scenario.compare(sc, ("corral-new", "ban"))["policies"]
    assert r["corral-new"]["controller"]["rpcs"] == r["ban"]["controller"]["rpcs"]
    assert r["ban"]["controller"]["rpcs"]["query"] > 0


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
    return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "simulate", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "150"})


def test_command_reports_in_three_forms(tmp_path: Path) -> None:
    page = tmp_path / "sim.html"
    r = _cli("--facility", "small", "--days", "1", "--people", "40", "--sweep", "0.1,0.4", "--html", str(page),
             "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["policies"]) == {"plain", "corral", "corral-new", "ban"}
    assert [row["share"] for row in out["sweep"]] == [0.1] * 4 + [0.4] * 4
    assert "no node placement" in out["limits"]
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
    (["--reserve", "1.5"], "--reserve must be a share of cores"),
    (["--guarantee", "-0.1"], "--guarantee must be a share of cores"),
    (["--walltime-margin", "0.5"], "--walltime-margin must be at least 1"),
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


def test_calibrate_writes_where_it_is_run_and_simulate_reads_it_when_told(tmp_path: Path) -> None:
    """`corral simulate calibrate` writes calibration.json in the directory it is run
    in (it wrote over the installed package's, a tracked file of a clone), says what to
    set when it has no cluster, and `corral simulate --calibration FILE` uses the file."""
    from click.testing import CliRunner

    from corral.edges.cli.main import cli
    from corral.simulate.controlplane import CALIBRATION

    before = CALIBRATION.read_bytes()
    runner = CliRunner()
    r = runner.invoke(cli, ["simulate", "calibrate"], env={"SLURM_CONF": str(tmp_path / "none.conf")})
    assert r.exit_code == 2 and "no slurm.conf at" in r.output and "SLURM_CONF" in r.output, r.output
    mine = json.loads(before)
    mine.update(submit_s=0.5, source="a slow site")
    (tmp_path / "calibration.json").write_text(json.dumps(mine))
    r = runner.invoke(cli, ["simulate", "--facility", "small", "--days", "1", "--policies", "plain", "--json",
                            "--calibration", str(tmp_path / "calibration.json")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["scenario"]["controller"]["source"] == "a slow site"
    assert CALIBRATION.read_bytes() == before


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


def test_a_preemptible_job_is_requeued_its_work_lost_and_it_finishes_later() -> None:
    """preempt/qos with REQUEUE: an opportunistic job soaks up the idle cores; a job
    that is not preemptible and needs them starts at once, the victim goes back to the
    queue, starts over when room frees, and the work it had done is counted lost."""
    fac = one_pool(8)
    agent = SimJob(1, 0.0, 100.0, 200.0, 6, agent=True)
    agent.pre, agent.key = True, (2, 0.0, 1)
    person = SimJob(2, 30.0, 50.0, 60.0, 4)
    small = SimJob(3, 31.0, 10.0, 20.0, 2, agent=True)
    small.pre, small.key = True, (2, 0.0, 3)
    e = Engine(fac, SchedConfig("easy", 0, preemption=True), record_starts=True)
    starts: list[tuple[int, float]] = []
    ends: dict[int, float] = {}
    low = [8]
    e.on_start = lambda j: (starts.append((j.id, e.now)), low.append(e.parts[0].free_c))
    e.on_end = lambda j: ends.__setitem__(j.id, e.now)
    e.run(iter([agent, person, small]))
    assert starts[:2] == [(1, 0.0), (2, 30.0)]  # the person did not wait for the agent's job
    assert e.preemptions == 1 and agent.requeues == 1 and e.lost_core_s == 6 * 30.0
    assert ends[2] == 80.0 and ends[1] == 80.0 + 100.0 and person.requeues == 0
    assert min(low) >= 0 and e.parts[0].free_c == 8 and e.parts[0].pre_c == 0
    # without preemption the same person waits for the agent's job to end
    for j in (agent, person, small):
        j.state, j.start, j.requeues = 0, -1.0, 0
    plain = Engine(fac, SchedConfig("easy", 0), record_starts=True)
    plain.run(iter([agent, person, small]))
    assert plain.starts is not None and plain.starts[2] == 100.0 and plain.preemptions == 0


def test_order_starts_the_smallest_opportunistic_job_first() -> None:
    """corral-new's ``order``: opportunistic jobs queue by cores x walltime, not by age,
    and people's jobs still come before any of them. Without it, by age."""
    from corral.simulate.levers import Levers

    starts = {}
    for on in (frozenset({"preempt"}), frozenset({"preempt", "order"})):
        e = Engine(one_pool(8), SchedConfig("easy", 0, preemption=True), record_starts=True)
        lv = Levers(e, on, guarantee=0.0, margin=2.0, history=3)
        person = SimJob(1, 0.0, 100.0, 100.0, 8)
        big = SimJob(2, 1.0, 50.0, 100.0, 8, agent=True)  # the older: 800 core-seconds asked
        small = SimJob(3, 2.0, 10.0, 50.0, 4, agent=True)  # 200: too long to backfill before the big one
        late = SimJob(4, 3.0, 10.0, 20.0, 4)  # a person's, after both
        for j in (big, small):
            assert not lv.tier(j)  # no guaranteed share: opportunistic
            j.key = lv.queued(j, j.submit)
        e.run(iter([person, big, small, late]))
        assert e.starts is not None and e.starts[1] == 0.0 and e.starts[4] == 100.0  # people first
        starts[on] = (e.starts[2], e.starts[3])
    assert starts[frozenset({"preempt"})] == (110.0, 160.0)  # by age: the big one, then the small
    assert starts[frozenset({"preempt", "order"})] == (110.0, 100.0)  # the small one beside the person


def test_accasim_keeps_the_reservation_with_the_blocked_job_not_the_first_place() -> None:
    """accasim-easy with priorities: a job that sorts before the blocked one (a person's
    before an agent's tier) is filled in like any other, and the blocked job starts once,
    at its reservation, though no event is left then (it took the first place's, started
    early and again at its reservation: two ends; or the run ended with a job queued)."""
    first, blocked, before = SimJob(1, 0.0, 50.0, 100.0, 6), SimJob(2, 1.0, 10.0, 100.0, 8), SimJob(3, 2.0, 10.0, 100.0, 5)
    blocked.key = (1, 1.0, 2)  # a lower tier than people's (0, submit, id): ``before`` sorts ahead of it
    e = Engine(one_pool(10), SchedConfig("accasim-easy", 0), record_starts=True)
    starts: list[tuple[int, float]] = []
    ends: list[int] = []
    e.on_start = lambda j: starts.append((j.id, e.now))
    e.on_end = lambda j: ends.append(j.id)
    e.run(iter([first, blocked, before]))
    assert starts == [(1, 0.0), (3, 50.0), (2, 100.0)] and sorted(ends) == [1, 2, 3]
    assert e.parts[0].free_c == 10 and e.parts[0].queue == []


def test_accasim_easy_runs_every_policy() -> None:
    """The command as run: corral-new's tiers put jobs before an accasim-easy reservation
    (it ended in a KeyError from the policy's bookkeeping before)."""
    r = _cli("--json", "--facility", "small", "--days", "5", "--scheduler", "accasim-easy")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)["policies"]
    assert set(got) == {"plain", "corral", "corral-new", "ban"}
    assert all(got[p]["counts"]["batch_agent_jobs"] > 0 for p in ("plain", "corral", "corral-new"))


def test_a_job_past_its_limit_ends_at_the_limit() -> None:
    e = Engine(one_pool(4), SchedConfig("easy", 0), record_starts=True)
    ends: dict[int, float] = {}
    e.on_end = lambda j: ends.__setitem__(j.id, e.now)
    e.run(iter([SimJob(1, 0.0, 500.0, 120.0, 2), SimJob(2, 0.0, 50.0, 120.0, 2)]))
    assert ends == {1: 120.0, 2: 50.0}


def test_corral_new_levers_each_do_what_they_claim() -> None:
    """corral-new without its levers is corral today, to the last figure; with them,
    agents' opportunistic work is preempted (and counted), walltimes are tightened from
    the sessions' earlier runs and an overrun is resubmitted, and the cap lets jobs
    larger than the Cedar limit through while people leave room."""
    from corral.simulate.levers import LEVERS
    from corral.simulate.policies import Run

    def run(policy: str, off: frozenset[str] = frozenset(), **kw: float) -> dict:
        sc = scenario.build(None, "small", 3, 3, AgentModel(share=0.4), PeopleModel(people=60, load=0.7),
                            SchedConfig("easy", 30, 200), corral_off=off, **kw)  # type: ignore[arg-type]
        f = Run(sc, policy).go()
        return {k: v for k, v in f.items() if k not in ("policy", "wall_s", "jobs_per_s")}

    today = run("corral")
    assert run("corral-new", frozenset(LEVERS)) == today
    assert today["preemptions"] == 0 and today["lost_core_h"] == 0 and today["levers"]["tightened"] == 0
    new = run("corral-new")
    assert new["preemptions"] > 0 and new["lost_core_h"] > 0 and new["useful_utilisation"] < new["utilisation"]
    lv = new["levers"]
    assert lv["tightened"] > 0 and lv["agent_limit_over_run"]["p50"] < today["levers"]["agent_limit_over_run"]["p50"]
    tight = run("corral-new", frozenset({"preempt", "cap"}), margin=1.0)  # no margin: some runs overrun
    assert tight["levers"]["overruns"] > 0 and tight["levers"]["overrun_core_h"] > 0 and tight["preemptions"] == 0
    # every agent job is answered once, overrun or not: as many results as jobs not refused
    c = tight["counts"]
    assert tight["agent_loop_s"]["n"] == c["agent_jobs"] - c["refused"]
    assert run("corral-new", frozenset({"preempt", "predict"}))["counts"]["resized"] < \
        run("corral-new", frozenset({"preempt", "predict", "cap"}))["counts"]["resized"]


def test_walltime_prediction_error_on_a_real_trace() -> None:
    """On COARE (whose jobs carry their users' requested times): a prediction for most
    jobs, the tightened limit far closer to the runtime than what users asked, and
    the jobs that would overrun it counted, not hidden."""
    from corral.simulate.predict import trace_error

    r = trace_error(shared_data("traces") / "DOST-ASTI-COARE-Saliksik-2020-cln.swf")
    assert r["jobs"] > 10_000 and r["predicted_share"] > 0.5
    assert r["tightened_over_run"]["p50"] < r["asked_over_run"]["p50"] / 2
    assert 0 < r["overrun_share"] < 0.5


def test_html_report_reads_at_a_glance(tmp_path: Path) -> None:
    """Issue 35's report: round ticks, x axes that end with the run, the controller's
    load on a log scale, no chart of command latency, the scenario as tables not JSON,
    and per policy the people's wait CDF, agents' results and utilisation over time."""
    import html
    import re

    from corral.simulate import report

    r = scenario.compare(_small(share=0.3))
    page = report.html_page(r)
    assert "do to small" not in page and "the small facility" in page
    assert '{"facility"' not in page and "<dt>People</dt>" in page and "command latency" not in page
    svgs = re.findall(r'<svg role="img" aria-label="([^"]+)".*?</svg>', page, re.S)
    titles = html.unescape(" | ".join(svgs))
    for want in ("People's wait", "Agents' results per hour over the run", "Utilisation over the run",
                 "RPCs per second (hourly mean, log scale)"):
        assert want in titles
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        assert 'class="small axis-label"' in svg and 'class="legend"' in svg
        assert len(re.findall(r'class="small tick x"', svg)) >= 2
    days = r["scenario"]["days"]
    for svg in re.findall(r'<svg[^>]*over the run.*?</svg>', page, re.S):
        ticks = [float(t) for t in re.findall(r'class="small tick x"[^>]*>([^<]+)<', svg)]
        assert ticks[0] == 0 and max(ticks) <= days and all(t * 4 == int(t * 4) for t in ticks)
    rpc = next(s for s in re.findall(r"<svg.*?</svg>", page, re.S) if "RPCs per second (hourly" in s)
    ys = re.findall(r'class="small tick y"[^>]*>([^<]+)<', rpc)
    assert len(ys) >= 2 and all(re.fullmatch(r"(0\.0*1|1(0)*|1,000(,000)*)", y.replace(",", "")) or y in
                                ("0.001", "0.01", "0.1") for y in ys), ys
    for f in r["policies"].values():
        assert all(d < days for d, _ in f["results_series"] + f["busy_series"])


@pytest.mark.usefixtures("slurm_turn")
def test_calibration_leaves_the_controllers_statistics_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48 item 10: on a shared controller people's monitoring reads sdiag's
    counters, so calibrate reads them before and after each step and never resets them
    (it ran `sdiag -r` five times). Its own RPCs are added to the counts, which only grow,
    and sdiag's 'Data since' is where it was."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf())
    from corral.simulate import calibrate

    before = calibrate.read()
    result = calibrate.calibrate(queries=12, held=10, clients=2, burst_s=0.5, say=lambda s: None)
    after = calibrate.read()
    assert after.since == before.since, "sdiag's statistics were reset"
    assert before.since > 0 and before.by_type.get("REQUEST_SUBMIT_BATCH_JOB", (0, 0))[0] + 10 \
        <= after.by_type["REQUEST_SUBMIT_BATCH_JOB"][0]
    assert after.by_type["REQUEST_JOB_INFO"][0] >= before.by_type.get("REQUEST_JOB_INFO", (0, 0))[0] + 24
    assert 0 < result["submit_s"] < 1 and 0 < result["query_base_s"] < 1 and result["others_rpcs"] >= 0
    assert "not reset" in result["source"]


def test_a_step_across_a_reset_is_refused_not_measured() -> None:
    """Counters that went back (a restart, someone's `sdiag -r`, midnight's reset) give
    no difference worth a figure: calibrate says so."""
    from corral.core.errors import InvalidRequest
    from corral.simulate.calibrate import Counters, delta

    a = Counters(100, {"REQUEST_JOB_INFO": (50, 9000)}, {})
    assert delta(a, Counters(100, {"REQUEST_JOB_INFO": (70, 13000)}, {})) == {"REQUEST_JOB_INFO": (20, 4000)}
    for b in (Counters(200, {"REQUEST_JOB_INFO": (70, 13000)}, {}), Counters(100, {"REQUEST_JOB_INFO": (3, 600)}, {})):
        with pytest.raises(InvalidRequest, match="began again"):
            delta(a, b)
