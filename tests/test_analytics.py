"""corral analyze / synth, run as the admin runs them: real subprocesses on real files
(a calibrated synthetic facility, exports recorded from a real Slurm, the SWF traces)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from bench._common import shared_data
from corral.analytics.frame import duration_s as _duration
from corral.analytics.ingest import detect, load
from corral.analytics.synth import Params

DATA = Path(__file__).parent / "data"


TRACES = shared_data("traces")


def corral(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def analyze_json(*args: str) -> dict[str, Any]:
    cp = corral("analyze", *args, "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


@pytest.fixture(scope="module")
def facility(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "facility.txt"
    cp = corral("synth", "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    return out


def test_synth_defaults_are_recovered_within_two_points(facility: Path) -> None:
    p = Params()
    r = analyze_json(str(facility), "--labels", f"{facility}.labels")
    a, ag = r["agents"], r["groups"]["agent"]
    for got, want in ((a["user_share"], p.agent_users), (a["submission_share"], p.agent_jobs),
                      (a["core_hour_share"], p.agent_cpu_hours), (a["gpu_hour_share"], p.agent_gpu_hours),
                      (ag["under_minute_share"], p.agent_short), (ag["cancelled_share"], p.agent_cancelled)):
        assert abs(got - want) <= 0.02, (got, want)
    assert abs(a["rate_vs_humans"] / p.rate_ratio - 1) < 0.1
    assert r["classification"]["against_labels"]["accuracy"] >= 0.95
    assert r["source"]["malformed"] == 0 and r["source"]["jobs"] == p.jobs
    # agents work through nights and weekends; humans mostly in office hours
    assert ag["off_hours_share"] > 2 * r["groups"]["human"]["off_hours_share"]
    assert sum(map(sum, r["heatmap"]["agent"])) == ag["jobs"]


def test_every_figure_is_a_parameter(tmp_path: Path) -> None:
    out = tmp_path / "f.txt"
    cp = corral("synth", "--out", str(out), "--users", "300", "--jobs", "60000", "--seed", "11",
                "--agent-users", "0.3", "--agent-jobs", "0.7", "--agent-cpu-hours", "0.45",
                "--agent-gpu-hours", "0.6", "--agent-short", "0.5", "--agent-cancelled", "0.2")
    assert cp.returncode == 0, cp.stderr
    r = analyze_json(str(out), "--labels", f"{out}.labels")
    a, ag = r["agents"], r["groups"]["agent"]
    for got, want in ((a["user_share"], 0.3), (a["submission_share"], 0.7), (a["core_hour_share"], 0.45),
                      (a["gpu_hour_share"], 0.6), (ag["under_minute_share"], 0.5), (ag["cancelled_share"], 0.2)):
        assert abs(got - want) <= 0.02, (got, want)
    assert r["classification"]["against_labels"]["accuracy"] >= 0.95


def test_synth_is_reproducible_and_refuses_bad_figures(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    for f in (a, b):
        assert corral("synth", "--out", str(f), "--users", "50", "--jobs", "5000").returncode == 0
    assert a.read_bytes() == b.read_bytes()
    bad = corral("synth", "--out", str(tmp_path / "c.txt"), "--agent-users", "1.5")
    assert bad.returncode == 2 and "agent-users must be a share between 0 and 1" in bad.stderr
    crowded = corral("synth", "--out", str(tmp_path / "c.txt"), "--users", "20", "--jobs", "2000000")
    assert crowded.returncode == 2 and "--users" in crowded.stderr and "Traceback" not in crowded.stderr


def test_overrides_settle_who_is_an_agent(facility: Path, tmp_path: Path) -> None:
    ov = tmp_path / "agents.txt"
    ov.write_text("# our facility's known cases\nh0001 agent\na0000 human  # a human-run pipeline\n")
    r = analyze_json(str(facility), "--overrides", str(ov))
    users = {u["user"]: u for u in r["classification"]["users_detail"]}
    assert users["h0001"]["kind"] == "agent" and users["h0001"]["basis"] == "override"
    assert users["a0000"]["kind"] == "human" and users["a0000"]["confidence"] == 1.0
    assert users["a0001"]["basis"] == "behaviour" and 0.5 <= users["a0001"]["confidence"] <= 1.0
    ov.write_text("h0001 robot\n")
    cp = corral("analyze", str(facility), "--overrides", str(ov))
    assert cp.returncode == 2 and "agents.txt:1" in cp.stderr and "'USER agent'" in cp.stderr


def test_real_slurm_exports_with_provenance(tmp_path: Path) -> None:
    """Exports recorded from the real Slurm: text and JSON agree, provenance is exact.
    The 30 jobs without provenance are the test suite's own, run as root: settled here
    by an override, since a test suite does behave like a machine."""
    ov = tmp_path / "ov.txt"
    ov.write_text("root human\n")
    text = analyze_json(str(DATA / "sacct-slurm2205.txt"), "--overrides", str(ov))
    js = analyze_json(str(DATA / "sacct-slurm2205.json"), "--overrides", str(ov))
    assert text["source"]["format"] == "sacct" and js["source"]["format"] == "sacct-json"
    assert text["source"]["jobs"] == js["source"]["jobs"] == 80
    assert text["source"]["steps_skipped"] == 80 and text["source"]["malformed"] == 0
    for r in (text, js):
        basis = r["classification"]["by_basis"]
        # corral's provenance in the job comment names agents and humans exactly
        assert basis.get("provenance/agent") and basis.get("provenance/human")
        assert r["groups"]["agent"]["jobs"] == 30 and r["groups"]["human"]["jobs"] == 50
        # an agent runs as its sponsor's Unix user; its principal is what is analysed
        users = {u["user"]: u for u in r["classification"]["users_detail"]}
        assert all(users[u]["basis"] == "provenance" for u in users if u != "root")
    assert text["agents"] == js["agents"]
    gpu = load(DATA / "sacct-slurm2205.txt").jobs.filter(pl.col("gpus") > 0)
    assert gpu.height == load(DATA / "sacct-slurm2205.json").jobs.filter(pl.col("gpus") > 0).height


def test_malformed_rows_are_counted_not_dropped_or_fatal(tmp_path: Path) -> None:
    good = (DATA / "sacct-slurm2205.txt").read_text().splitlines()
    f = tmp_path / "broken.txt"
    f.write_text("\n".join(good[:6] + [
        "999|alice|acct|debug|x|2026-11-30T12:00:00",                                   # too few fields
        "1000||acct|debug|x|2026-11-30T12:00:00|Unknown|Unknown|0|PENDING|0:0|1||",      # no user
        "1001|bob|acct|debug|x|yesterday|Unknown|Unknown|0|PENDING|0:0|1||",              # bad time
        "1002|bob|acct|debug|x|2026-11-30T12:00:00|Unknown|Unknown|zero|PENDING|0:0|1||",  # bad number
        "1003|bob|acct|debug|x|2026-11-30T12:00:00|Unknown|Unknown|0|WEIRD_STATE|0:0|1||",  # unknown state: kept
    ]) + "\n")
    r = analyze_json(str(f))
    s = r["source"]
    assert s["rows_read"] == 10 and s["malformed"] == 4
    assert s["malformed_examples"]["wrong number of fields (expected 14)"] == [7]
    assert s["malformed_examples"]["no user"] == [8]
    assert s["malformed_examples"]["unreadable Submit time"] == [9]
    assert s["malformed_examples"]["unreadable elapsed time"] == [10]
    assert s["jobs"] + s["steps_skipped"] + s["malformed"] == s["rows_read"]
    human = corral("analyze", str(f))
    assert human.returncode == 0 and "4 malformed" in human.stdout and "line 7" in human.stdout


def test_bad_input_says_what_to_fix(tmp_path: Path) -> None:
    missing = corral("analyze", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    nohead = tmp_path / "nohead.txt"
    nohead.write_text("1|alice|2026-11-30T12:00:00|COMPLETED\n")
    cp = corral("analyze", str(nohead))
    assert cp.returncode == 2 and "header line lacks" in cp.stderr and "--format=JobID" in cp.stderr
    garbage = tmp_path / "x.json"
    garbage.write_text("{not json")
    cp = corral("analyze", str(garbage))
    assert cp.returncode == 2 and "not a readable sacct-json file" in cp.stderr
    for c in (missing, cp):
        assert "Traceback" not in c.stderr


@pytest.mark.parametrize("name,jobs", [("DOST-ASTI-COARE-Saliksik-2020-cln.swf", 19760),
                                       ("NASA-iPSC-1993-3.1-cln.swf.gz", 18239), ("lublin_256.swf", 10000)])
def test_swf_traces_give_the_human_baseline(name: str, jobs: int) -> None:
    r = analyze_json(str(TRACES / name))
    assert r["source"]["format"] == "swf" and r["source"]["jobs"] == jobs and r["source"]["malformed"] == 0
    assert r["agents"]["submission_share"] == 0 and r["groups"]["human"]["jobs"] == jobs
    assert r["groups"]["human"]["core_hours"] > 0
    if name.startswith("DOST"):  # partitions named in its header, real waits
        assert r["groups"]["human"]["wait_p50_s"] is not None and r["period"]["first_submit"].startswith("2020-03")
        # the behaviour score's false positives on a pre-agent trace, reported, not applied
        assert r["classification"]["behaviour_would_flag"] < 0.05 * r["classification"]["users"]
    if name.startswith("lublin"):  # a model trace without users: said first, loudly, in every output
        assert any("no users" in w for w in r["source"]["warnings"])
        cp = corral("analyze", str(TRACES / name))
        assert cp.returncode == 0 and cp.stdout.lstrip().startswith("warning: the trace records no users")


def test_formats_and_durations() -> None:
    assert detect(DATA / "sacct-slurm2205.txt") == "sacct"
    assert detect(DATA / "sacct-slurm2205.json") == "sacct-json"
    assert detect(TRACES / "NASA-iPSC-1993-3.1-cln.swf.gz") == "swf"
    df = pl.DataFrame({"e": ["1-02:03:04", "02:03:04", "03:04", "bad"]})
    assert df.select(_duration(pl.col("e")))["e"].to_list() == [93784, 7384, 184, None]


def test_corral_records_are_exact(gateway, people) -> None:
    """The gateway's own database: every job's principal kind is known."""
    with gateway.http() as h:  # a service principal: a CI runner, neither a person nor an agent
        assert h.post("/v1/principals", json={"name": "ci", "kind": "service"}).status_code == 201
        people = {**people, "ci": h.post("/v1/tokens", json={"for": "ci", "expires": "1h"}).json()["token"]}
    jobs = []
    for who in ("bot1", "bot1", "alice", "ci"):
        with gateway.http(people[who]) as h:
            jobs.append((who, h.post("/v1/jobs", json={"command": "true"}).json()["id"]))
    for who, jid in jobs:
        with gateway.http(people[who]) as h:
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
    r = analyze_json(str(gateway.home / "corral.db"))
    assert r["source"]["format"] == "corral" and r["source"]["jobs"] == 4
    assert r["groups"]["agent"]["jobs"] == 2 and r["groups"]["human"]["jobs"] == 1
    assert r["groups"]["human"]["users"] == 1 and r["services"]["users"] == 1 and r["services"]["jobs"] == 1
    assert r["agents"]["submission_share"] == round(2 / 3, 4)  # of agents' and people's jobs, not the service's
    assert r["classification"]["by_basis"] == {"provenance/agent": 1, "provenance/human": 1, "provenance/service": 1}


def _chromium() -> str:
    import os
    import shutil

    path = shutil.which("chromium")
    if not path:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is required under CI for the HTML report test; make test runs scripts/browser-up")
        pytest.skip("no Chromium here: run scripts/browser-up (as root) to test the HTML report")
    return path


def test_html_report_in_a_real_browser(facility: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "report.html"
    cp = corral("analyze", str(facility), "--html", str(page_file))
    assert cp.returncode == 0, cp.stderr
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri())
            assert page.title() == "corral: what agents do on this facility"
            assert "19.5%" in page.locator("#cards").inner_text()  # the agents' share of users
            assert page.locator("svg").count() == 11  # + 3 series a day, 2 distributions, 2 colour scales
            assert page.locator("svg.ts").count() == 3 and page.locator("svg.hist").count() == 2
            assert "agent" in (page.locator("svg.ts").first.text_content() or "")  # the legend
            assert page.locator("svg.heat rect").count() == 2 * 7 * 24
            # each heatmap has its colour scale, up to its busiest hour
            for heat, scale in zip(page.locator("svg.heat").all(), page.locator("svg.heat-scale").all()):
                peak = max(int(re.search(r"— ([\d,]+) jobs", t.text_content() or "").group(1).replace(",", ""))
                           for t in heat.locator("title").all())
                labels = [t.text_content() for t in scale.locator("text").all()]
                assert labels[0] == "0" and labels[-2] == f"{peak:,}" and "jobs submitted in that hour" in labels[-1]
            # percentiles say their unit
            for table in ("#wait-quantiles", "#run-quantiles"):
                head = page.locator(f"{table} tr").first.inner_text()
                assert "p50 (s)" in head and "max (s)" in head, head
            assert page.locator("svg.scatter circle").count() == 400 + 2  # one dot per user, and the legend's two
            box = page.locator("svg.bars").bounding_box()
            assert box and box["width"] > 300 and box["height"] > 100  # drawn, not collapsed
            assert page.locator("#groups tr").count() == 15
            shot = page.screenshot(full_page=True)
        finally:
            browser.close()
    assert requests == [page_file.as_uri()], "the report must fetch nothing"
    assert errors == []
    assert len(shot) > 50_000  # a page of plots, not a blank one


def test_the_audit_chain_is_an_input_too(gateway, people) -> None:
    for who in ("bot1", "bot1", "alice"):
        with gateway.http(people[who]) as h:
            h.post("/v1/jobs", json={"command": "true"})
    with gateway.http(people["bot2"]) as h:
        assert h.post("/v1/jobs", json={"command": "true", "cpus": 999}).status_code == 400
    r = analyze_json(str(gateway.home / "audit.jsonl"))
    assert r["source"]["format"] == "audit" and r["source"]["jobs"] == 3 and r["source"]["malformed"] == 0
    assert r["groups"]["agent"]["jobs"] == 2 and r["groups"]["human"]["jobs"] == 1
    assert any("refused submissions" in n for n in r["source"]["notes"])


def test_inputs_an_admin_has(tmp_path: Path) -> None:
    """A CSV export is recognised (by its content too) and read; every malformed sacct
    --json shape is a clear error or counted rows; one user's export, an export with no
    readable job, and negative waits are said, not misreported."""
    people = [f"u{i}" for i in range(6)]
    lines = ["JobID,User,Account,SubmitTime,WaitTime,RunTime,NCPUS,State"]
    for i in range(60):
        lines.append(f"{i},{people[i % 6]},proj,{1_780_000_000 + 600 * i},{-30 if i == 7 else 20},120,2,"
                     f"{'NODE_FAIL' if i == 3 else 'COMPLETED'}")
    lines.append("60,u1,proj,yesterday,20,120,2,COMPLETED")
    export = tmp_path / "accounting-export.txt"  # no .csv: recognised from its header
    export.write_bytes(("\n".join(lines) + "\n").encode() + b"61,u\xff2,proj,1780000000,1,1,1,COMPLETED\n")
    r = analyze_json(str(export))
    assert r["source"]["format"] == "csv" and r["source"]["jobs"] == 60
    assert r["source"]["malformed_by_reason"] == {"unreadable submission time": 1, "bytes that are not UTF-8": 1}
    assert r["groups"]["human"]["negative_waits"] == 1 and any("negative_waits" in n for n in r["source"]["notes"])
    assert r["groups"]["human"]["failed_share"] > 0  # NODE_FAIL: the job did not finish
    odd = tmp_path / "odd.csv"
    odd.write_text("Foo,Bar,Baz\n1,2,3\n")
    cp = corral("analyze", str(odd))
    assert cp.returncode == 2 and "CSV export with columns Foo, Bar, Baz" in cp.stderr and "User" in cp.stderr
    # sacct --json, every broken shape
    shapes = {'{"jobs": []}': "holds no jobs", '{"jobs": 3}': "not a list", '{"meta": {}}': "no 'jobs' list",
              '[1, 2]': "no 'jobs' list", '{"jobs": [{"job_id": "x", "user": "a"}]}': "no submission time",
              '{"jobs": [7, "x", null]}': "not an object"}
    for text, said in shapes.items():
        f = tmp_path / "shape.json"
        f.write_text(text)
        cp = corral("analyze", str(f), "--json")
        assert cp.returncode == 2 and said in cp.stderr and "Traceback" not in cp.stderr, (text, cp.stderr)
    good = [{"job_id": i, "user": f"u{i % 4}", "time": {"submission": {"set": True, "number": 1_780_000_000 + i},
                                                        "start": 1_780_000_010 + i, "end": 1_780_000_100 + i,
                                                        "elapsed": 90},
             "state": {"current": ["COMPLETED"]}, "exit_code": {"return_code": {"set": True, "number": 0}}}
            for i in range(40)]
    broken = [{"job_id": 99, "user": "u1", "time": {"submission": "soon"}, "state": "COMPLETED"},
              {"job_id": 98, "user": 12.5, "time": {"submission": 1_780_000_000}, "state": "COMPLETED"},
              "not a job", {"job_id": 97, "user": "u2", "time": 5, "state": "COMPLETED"}]
    f = tmp_path / "mixed.json"
    # one job's user an escaped lone surrogate, another's a raw byte that is not UTF-8
    f.write_bytes(json.dumps({"jobs": good + broken}).replace('"u3"', '"u\\udcff3"', 1).encode()
                  .replace(b'"u2"', b'"u\xff2"', 1))
    r = analyze_json(str(f))
    assert r["source"]["jobs"] == 38 and r["source"]["malformed"] == 6, r["source"]
    assert r["source"]["malformed_by_reason"] == {
        "time.submission is not a number": 1, "user is not text": 1, "a job that is not an object": 1,
        "time is not an object": 1, "bytes that are not UTF-8": 2}
    one = tmp_path / "mine.json"
    one.write_text(json.dumps({"jobs": [{**j, "user": "alice"} for j in good]}))
    cp = corral("analyze", str(one))
    assert cp.returncode == 2 and "one user's export" in cp.stderr and "--allusers" in cp.stderr
    cp = corral("synth", "--users", "2000", "--jobs", "20000", "--out", str(tmp_path / "big.txt"))
    assert cp.returncode == 0, cp.stderr


def test_one_bad_byte_counts_its_row_not_the_file(tmp_path: Path) -> None:
    lines = ["JobID|User|Submit|State"] + [f"{i}|u{i % 4}|2026-11-30T12:00:0{i % 10}|COMPLETED" for i in range(1, 21)]
    sacct = tmp_path / "export.txt"
    sacct.write_bytes(("\n".join(lines) + "\n").encode() + b"21|u\xff1|2026-11-30T12:00:00|COMPLETED\n")
    r = analyze_json(str(sacct))
    assert r["source"]["jobs"] == 20 and r["source"]["malformed_by_reason"] == {"bytes that are not UTF-8": 1}
    assert r["source"]["malformed_examples"] == {"bytes that are not UTF-8": [22]}
    swf = tmp_path / "trace.swf"
    swf.write_bytes(b";Version: 2\n" + b"".join(
        f"{i} {i * 10} 5 100 4 -1 -1 4 200 -1 1 {i % 5} 1 1 1 1 -1 -1\n".encode() for i in range(1, 30))
        + b"30 300 5 \xff00 4 -1 -1 4 200 -1 1 3 1 1 1 1 -1 -1\n")
    r = analyze_json(str(swf))
    assert r["source"]["jobs"] == 29 and r["source"]["malformed_by_reason"] == {"bytes that are not UTF-8": 1}


@pytest.mark.parametrize("share,ratio,human_rate,short,off", [
    (0.05, 5, 10, 0.1, 0.8), (0.4, 5, 1, 0.5, 0.1), (0.4, 30, 10, 0.1, 0.1),
    (0.2, 10, 4, 0.1, 0.1), (0.05, 30, 1, 0.5, 0.8), (0.3, 5, 4, 0.1, 0.8)])
def test_users_are_judged_against_the_facilitys_own_people(tmp_path: Path, share: float, ratio: float,
                                                           human_rate: float, short: float, off: float) -> None:
    """Facilities unlike the paper's (people at 1 or 10 jobs an hour, agents 5% or 40% of
    users, 5x or 30x faster, rarely or often short or at night): >= 95% of users right
    and the agents' share within 3 points (bench/classify_sweep.py runs the whole grid)."""
    from corral.analytics.classify import accuracy, classify, read_labels
    from corral.analytics.ingest import load
    from corral.analytics.synth import Params, write

    users = 200
    agent_jobs = min(max(share * ratio / (share * ratio + (1 - share)), 0.05), 0.95)
    out = tmp_path / "f.txt"
    write(Params(users=users, jobs=max(int(users * (1 - share) * 40 / (1 - min(0.9, agent_jobs))), users * 20),
                 days=30, agent_users=share, agent_jobs=agent_jobs, rate_ratio=ratio, human_rate=human_rate,
                 agent_short=short, agent_off_hours=off, seed=3), out)
    truth = read_labels(Path(f"{out}.labels"))
    got = classify(load(out).jobs)
    acc = accuracy(got, truth)
    true_share = sum(v == "agent" for v in truth.values()) / len(truth)
    assert acc["accuracy"] >= 0.95, acc
    assert abs((got["kind"] == "agent").sum() / got.height - true_share) * 100 <= 3


def test_a_csv_with_run_times_but_no_start_or_wait_is_read_and_says_so(tmp_path: Path) -> None:
    """A trace summarised to submit and run times is read, its waits unknown and said to
    be (it failed in polars: a time plus a duration on an untyped null); one with no start,
    wait or run time is refused naming them, as JSON under analyze --json."""
    rows = [f"{i},u{i % 6},{1_780_000_000 + 3600 * i}" for i in range(60)]
    trace = tmp_path / "trace.csv"
    trace.write_text("JobID,User,SubmitTime,RunTime\n" + "".join(f"{r},{30 + i}\n" for i, r in enumerate(rows)))
    ing = load(trace)
    assert ing.jobs.height == 60 and ing.jobs["start"].null_count() == ing.jobs["end"].null_count() == 60
    assert sorted(ing.jobs["elapsed_s"].to_list()) == [30 + i for i in range(60)]
    r = analyze_json(str(trace))
    assert r["source"]["jobs"] == 60 and any("no start or wait time" in n for n in r["source"]["notes"])
    assert sum(g["jobs"] for g in r["groups"].values()) == 60
    assert all(g.get("wait_p50_s") is None for g in r["groups"].values())
    bare = tmp_path / "bare.csv"
    bare.write_text("JobID,User,SubmitTime\n" + "\n".join(rows) + "\n")
    cp = corral("analyze", str(bare), "--json")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert json.loads(cp.stdout)["error"]["message"].endswith("none that corral reads as a start, a wait or a run time")


def test_the_tables_an_admin_expects_and_their_csv(facility: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    cp = corral("analyze", str(facility), "--json", "--csv", str(out), "--capacity-cores", "4096")
    assert cp.returncode == 0, cp.stderr
    t = json.loads(cp.stdout)["tables"]
    assert {p.name for p in out.iterdir()} == {f"{n}.csv" for n in t}
    assert len({r["day"] for r in t["daily"]}) == 30 and {r["group"] for r in t["daily"]} == {"agent", "human"}
    assert len({r["week"] for r in t["weekly"]}) in (5, 6)
    assert [r["size"] for r in t["by_size"] if r["group"] == "human"][:2] == ["1", "2-4"]
    jobs = sum(r["jobs"] for r in t["by_partition"])
    assert jobs == sum(r["jobs"] for r in t["daily"]) == sum(r["jobs"] for r in t["by_size"])
    # accounts by use, the most core-hours first (the report shows the first 30)
    used: dict[str, float] = {}
    for r in t["by_account"]:
        used[r["account"]] = used.get(r["account"], 0.0) + r["core_hours"]
    order = list(dict.fromkeys(r["account"] for r in t["by_account"]))
    assert len(order) > 2 and [used[a] for a in order] == sorted(used.values(), reverse=True)
    wait = {r["group"]: r for r in t["wait_distribution"]}
    assert wait["agent"]["p10"] <= wait["agent"]["p50"] <= wait["agent"]["p99"] <= wait["agent"]["max"]
    day = t["utilisation"][0]
    assert day["capacity_core_hours"] == 4096 * 24 and abs(day["utilisation"] - day["core_hours"] / (4096 * 24)) < 1e-3
    confidences = [u["confidence"] for u in t["users"] if u["confidence"] is not None]
    assert confidences == sorted(confidences)  # least certain first
    daily = (out / "daily.csv").read_text().splitlines()
    assert daily[0] == "day,group,jobs,core_hours,gpu_hours,users" and len(daily) == len(t["daily"]) + 1
    swf = shared_data("traces") / "DOST-ASTI-COARE-Saliksik-2020-cln.swf"
    r = analyze_json(str(swf))  # an SWF header's MaxProcs is the capacity
    assert r["tables"]["utilisation"][0]["capacity_core_hours"] == 1728 * 24
