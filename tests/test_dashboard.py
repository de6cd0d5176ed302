"""The admins' dashboard in real Chromium (Debian's, driven by Playwright): it signs in
with a token through its form, renders with no console errors and fetches nothing from
elsewhere, updates without a reload when a job changes state, shows a sponsor only
their agents, and refuses a missing, wrong or agent's token. And the Grafana dashboard
in docs/ asks only for metrics the gateway exports."""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import SHARED_TURN, Gateway
from .test_analytics import _chromium

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _browser(p):  # type: ignore[no-untyped-def]
    return p.chromium.launch(executable_path=_chromium(), args=[
        "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module's tests (each test opens its own contexts)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = _browser(p)
        try:
            yield b
        finally:
            b.close()


def _sign_in(page, url: str, token: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{url}/dashboard")
    page.fill("#token", token)
    page.click("button[type=submit]")


SECRET = "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"


def test_the_dashboard_lives_in_a_real_browser(gateway: Gateway, people: dict[str, str], agent_dir: Path,
                                               browser: Any) -> None:
    with gateway.http(people["bot1"], session="bot1-s1") as bot, gateway.http(people["carol"], session="c-1") as carol:
        done = bot.post("/v1/jobs", json={"command": "echo hi", "name": "greeting", "cpus": 2, "memory": "256M",
                                          "walltime": "5m", "workdir": str(agent_dir)}).json()
        assert bot.get(f"/v1/jobs/{done['id']}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
        carol.post("/v1/jobs", json={"command": f"echo carol && export {SECRET}"})
        # a refusal, for the table by rule and the session's drill-down
        assert bot.post("/v1/jobs", json={"command": "rm -rf /", "workdir": str(agent_dir)}).status_code == 403
    requests: list[str] = []
    errors: list[str] = []
    contexts = [browser.new_context(viewport={"width": 360, "height": 900}) for _ in range(3)]
    try:
        page, sponsor, other = (c.new_page() for c in contexts)
        page.on("request", lambda r: requests.append(r.url))
        for p in (page, sponsor):
            p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            p.on("pageerror", lambda e: errors.append(str(e)))
        _sign_in(page, gateway.url, gateway.admin_token)
        assert page.url == f"{gateway.url}/dashboard"  # the token is in no URL
        assert "admin" in page.locator("header .who").inner_text()
        sessions = page.locator("#sessions").inner_text()
        assert "bot1-s1" in sessions and "c-1" in sessions
        assert "agents-no-harmful-commands" in page.locator("#refusals").inner_text()
        # On a phone's screen the refusals' bars stay inside their card, and no card's
        # content spills out of it (a wide table scrolls inside its card).
        card = page.locator("#refusals").bounding_box()
        for meter in page.locator("#refusals meter").all():
            box = meter.bounding_box()
            assert box["x"] + box["width"] <= card["x"] + card["width"], (box, card)
        assert page.evaluate("""[...document.querySelectorAll('main > section')]
            .filter(s => s.scrollWidth > s.clientWidth + 1 && getComputedStyle(s).overflowX === 'visible')
            .map(s => s.id)""") == []
        assert page.evaluate("(s => s.scrollWidth <= s.clientWidth + 1)(document.getElementById('refusals'))")
        assert "intact" in page.locator("#audit").inner_text()
        # A job changes state: the page shows it without a reload.
        with gateway.http() as h:
            job = h.post("/v1/jobs", json={"command": "sleep 2"}).json()
            page.wait_for_selector("#jobs tr[data-state=RUNNING]", timeout=15_000)
            h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        page.wait_for_selector("#jobs tr[data-state=RUNNING]", state="detached", timeout=15_000)
        # The session's drill-down: its jobs, what they asked and took, and what was refused.
        page.click("#sessions a:has-text('bot1-s1')")
        row = page.locator(f"#session-jobs tr[data-job='{done['id']}']")
        text = row.inner_text()
        assert "echo hi" in text and "greeting" in text and "2 CPU, 256 MB, 5 min" in text
        assert re.fullmatch(r"\d+s", row.locator(".elapsed").inner_text().strip())
        refused = page.locator("#session-refused").inner_text()
        assert "agents-no-harmful-commands" in refused and "rm -rf /" in refused
        page.go_back()
        page.click("#sessions a:has-text('c-1')")
        shown = page.locator("#session-jobs").inner_text()
        assert "echo carol" in shown and "[REDACTED]" in shown and SECRET.split("=")[1] not in shown
        assert "nothing refused" in page.locator("#session-refused").inner_text()
        page.go_back()
        # A sponsor sees only their agents.
        _sign_in(sponsor, gateway.url, people["alice"])
        seen = sponsor.locator("#sessions").inner_text()
        assert "bot1-s1" in seen and "c-1" not in seen and "carol" not in seen
        assert sponsor.locator("#pools").count() == 0
        # their plots are of their agents' jobs; the facility's utilisation and calls are the admins'
        assert sum(_plot(sponsor, "submissions")["agent"]) == 1 and "human" not in _plot(sponsor, "submissions")
        assert sponsor.locator("#plot-utilisation").count() == 0 and sponsor.locator("#plot-saved").count() == 0
        r = sponsor.request.get(f"{gateway.url}/dashboard/sessions/carol/c-1")
        assert r.status == 404
        # Wrong, missing and agents' tokens are refused, saying what to do.
        _sign_in(other, gateway.url, "crb_not_a_token")
        assert "not valid" in other.locator("#error").inner_text()
        _sign_in(other, gateway.url, people["bot1"])
        assert "for people" in other.locator("#error").inner_text()
        assert other.request.get(f"{gateway.url}/dashboard/live").status == 401
        # Signing out ends it.
        page.click("text=Sign out")
        page.locator("#token").wait_for(timeout=15_000)  # the sign-in page, once the navigation lands
        assert page.locator("#token").count() == 1
    finally:
        for c in contexts:
            c.close()
    assert all(u.startswith(gateway.url) for u in requests), [u for u in requests if not u.startswith(gateway.url)]
    assert errors == []


PLOTS = {"submissions": "jobs / min", "queue": "jobs waiting", "states": "jobs in the minute",
         "utilisation": "% of CPUs", "saved": "calls"}


def _plot(page: Any, name: str) -> dict[str, list[float]]:
    """One plot as the page shows it: its lines' figures by legend name, after checking
    that it has both axes (the value axis labelled with its unit) and a legend naming
    every line."""
    # One snapshot, read in one call: the page redraws a live plot between two reads (a
    # tick's label was once read from the new drawing as the unit's from the old).
    snap = page.locator(f"#plot-{name}").evaluate("""p => {
        const s = p.querySelector('svg'), t = q => [...s.querySelectorAll(q)].map(e => e.textContent);
        return {unit: s.getAttribute('data-unit'), x: t('g.axis.x text'), xhtml: s.querySelector('g.axis.x').innerHTML,
                y: t('g.axis.y text'), legend: t('g.legend text'),
                lines: [...s.querySelectorAll('polyline')].map(l => [l.getAttribute('data-series'), l.getAttribute('data-values')])};
    }""")
    assert snap["unit"] == PLOTS[name]
    assert len(snap["x"]) >= 4  # clock ticks and the axis' name
    assert "time" in snap["xhtml"]
    labels = snap["y"]
    assert labels[-1] == PLOTS[name]  # the value axis names its unit
    ticks = [float(t) for t in labels[:-1]]  # round ticks, evenly spaced: 0, 2, 4... never 1.25
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert ticks[0] == 0 and len(ticks) >= 2 and len(steps) == 1, ticks
    step = steps.pop()
    assert round(step / 10 ** math.floor(math.log10(step)), 6) in (1, 2, 5), ticks
    lines = {series: [float(v) for v in values.split(",")] for series, values in snap["lines"]}
    legend = snap["legend"]
    assert legend == list(lines), (legend, list(lines))
    assert all(len(v) == 30 for v in lines.values()) or name == "saved"
    return lines


def _live(page: Any, name: str, test: str, timeout_s: float = 30) -> dict[str, list[float]]:
    """Wait, without reloading, until the page's plot ``name`` satisfies ``test`` (a
    Python expression over ``lines``) -> its lines."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = _plot(page, name)
        if eval(test, {}, {"lines": lines}):
            return lines
        assert time.monotonic() < deadline, f"{name}: {test} never held; last {lines}"
        page.wait_for_timeout(500)


def test_the_plots_show_a_scripted_workload_live(gateway: Gateway, people: dict[str, str], agent_dir: Path,
                                                 browser: Any) -> None:
    """A scripted workload: 3 agent jobs and 2 people's, waited for; then, with the page
    open, a job that fills the 2 CPUs and one that waits behind it. Each plot has its
    axes, unit and legend, shows these figures, and follows them without a reload."""
    reads = 0
    with gateway.http(people["bot1"]) as bot, gateway.http(people["carol"]) as carol:
        ids = [bot.post("/v1/jobs", json={"command": f"echo {i}", "workdir": str(agent_dir)}).json()["id"]
               for i in range(3)]
        ids += [carol.post("/v1/jobs", json={"command": "true"}).json()["id"] for _ in range(2)]
        for who, i in zip((bot, bot, bot, carol, carol), ids):
            assert who.get(f"/v1/jobs/{i}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
            reads += 1
    with gateway.http() as h:  # every job ended (the admin sees them all)
        for i in ids:
            assert h.get(f"/v1/jobs/{i}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
            reads += 1
    context = browser.new_context()
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        _sign_in(page, gateway.url, gateway.admin_token)
        subs = _plot(page, "submissions")
        assert sum(subs["agent"]) == 3 and sum(subs["human"]) == 2, subs
        assert sum(_plot(page, "states")["COMPLETED"]) == 5
        assert max(_plot(page, "queue").get("local", [0])) <= 5
        # What corral saved: the local backend has no controller, and says so; what clients
        # would have asked is an sbatch per job and a query per read.
        saved = page.locator("#saved table.backend[data-backend=local]")
        assert int(saved.locator(".without").inner_text()) == 5 + reads
        assert int(saved.locator(".asked").inner_text()) == 0
        assert "no scheduler controller" in page.locator("#saved .means").inner_text()
        # Live: a job holds both CPUs, another waits behind it.
        with gateway.http(people["carol"]) as carol:
            big = carol.post("/v1/jobs", json={"command": "sleep 6", "cpus": 2}).json()["id"]
            carol.get(f"/v1/jobs/{big}/wait", params={"timeout": 30, "until": "RUNNING"})
            small = carol.post("/v1/jobs", json={"command": "true"}).json()["id"]
            reads += 1
            _live(page, "submissions", "sum(lines['human']) == 4")
            _live(page, "queue", "lines['local'][-1] >= 1")
            _live(page, "states", "lines['RUNNING'][-1] >= 1 and lines['PENDING'][-1] >= 1")
            # 2 of the 2 CPUs held for part of the last minute: above 0, at most 100 %.
            util = _live(page, "utilisation", "lines['CPUs held by jobs'][-1] > 0")
            assert all(0 <= v <= 100 for v in util["CPUs held by jobs"])
            for i in (big, small):
                assert carol.get(f"/v1/jobs/{i}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
                reads += 1
        _live(page, "states", "sum(lines['COMPLETED']) == 7")
        lines = _live(page, "saved", f"lines['clients would have asked'][-1] == {7 + reads}")
        assert lines["corral asked the controller"][-1] == 0
        assert errors == []
    finally:
        context.close()


@contextlib.contextmanager
def _admin_board(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=60) as c:
        assert c.post("/dashboard/login", data={"token": gateway.admin_token}).status_code == 303
        yield c


def test_budgets_are_shown_against_their_limits(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    """A token minted with a CPU-hour budget and a cap on live jobs: the board shows
    what was used of each limit (a live job charged its whole walltime, as admit does)."""
    with gateway.http() as h:
        limited = h.post("/v1/tokens", json={"for": "bot1", "cpu_hours": 2, "max_active_jobs": 3,
                                             "submits_per_min": 10}).json()
    with gateway.http(limited["token"]) as bot:
        job = bot.post("/v1/jobs", json={"command": "sleep 5", "walltime": "30m", "workdir": str(agent_dir)}).json()
        with _admin_board(gateway) as c:
            rows = [b for b in c.get("/dashboard/live.json").json()["budgets"] if b["principal"] == "bot1"]
            assert [(b["cpu_hours"], b["cpu_limit"], b["active_jobs"], b["active_limit"], b["rate_limit"])
                    for b in rows] == [(0.5, 2.0, 1, 3, 10)]
            html = c.get("/dashboard/live").text
            row = re.search(rf'<tr data-token="{rows[0]["token"]}">(.*?)</tr>', html, re.S)
            assert row and "0.5 of 2.0" in row.group(1) and "1 of 3" in row.group(1) and "10/min" in row.group(1)
        bot.post(f"/v1/jobs/{job['id']}/cancel")


def test_the_fast_lane_pool_is_named_for_people(gateway: Gateway) -> None:
    with gateway.http() as h:
        task = h.post("/v1/jobs", json={"command": "true", "lane": "fast"}).json()
        assert h.get(f"/v1/jobs/{task['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
    with _admin_board(gateway) as c:
        html = c.get("/dashboard/live").text
    pools = re.findall(r'<tr data-pool="([^"]*)"><td>([^<]*)</td>', html)
    assert pools, html[html.find('id="pools"'):][:2000]
    for _slug, name in pools:
        assert "_-_" not in name and "default account" in name and "partition" in name and "CPUs" in name, name


@SHARED_TURN  # counts its own gateway's commands only
def test_what_corral_saved_a_real_slurm_is_counted_in_its_commands(tmp_path: Path, slurm_turn: None) -> None:
    """On Slurm, what corral asked is the Slurm commands it ran (not its status ticks,
    most answered by jobs' own reports), set against an sbatch per job and a query per
    read of its clients; the panel says what the figure means."""
    from .slurm_env import slurm_conf
    from .test_gateway_slurm import start_slurm_gateway

    gw = start_slurm_gateway(tmp_path, slurm_conf())
    try:
        with gw.http() as h:
            ids = [h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}).json()["id"] for _ in range(2)]
            for i in ids:
                assert h.get(f"/v1/jobs/{i}/wait", params={"timeout": 120}).json()["state"] == "COMPLETED"
            for _ in range(5):
                h.get(f"/v1/jobs/{ids[0]}")
            assert h.post(f"/v1/jobs/{ids[0]}/cancel").status_code in (200, 409)
        with _admin_board(gw) as c:
            board = c.get("/dashboard/live.json").json()
            slurm = board["saved"]["backends"][0]
            html = c.get("/dashboard/live").text
    finally:
        gw.kill(signal.SIGTERM)
    assert slurm["backend"] == "slurm" and slurm["jobs"] == 2 and slurm["reads"] == 7 and slurm["cancels"] == 1
    assert slurm["without_corral"] == 10
    assert slurm["by_command"]["sbatch"] == 2 and slurm["corral_asked"] == sum(slurm["by_command"].values())
    assert slurm["ratio"] == round(10 / slurm["corral_asked"], 1)
    assert f"Corral sent {slurm['corral_asked']}" in slurm["means"] and "Corral sent" in html


def test_a_revoked_token_signs_the_viewer_out(gateway: Gateway, people: dict[str, str]) -> None:
    with httpx.Client(base_url=gateway.url) as c:
        r = c.post("/dashboard/login", data={"token": people["alice"]})
        assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower() \
            and "samesite=strict" in r.headers["set-cookie"].lower()
        assert people["alice"] not in r.headers["set-cookie"]
        assert c.get("/dashboard/live.json").json()["viewer"]["name"] == "alice"
        with gateway.http() as h:
            tid = [t for t in h.get("/v1/tokens").json() if t["principal"] == "alice"][0]["id"]
            assert h.delete(f"/v1/tokens/{tid}").status_code == 200
        r = c.get("/dashboard/live.json")
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
        page = c.get("/dashboard")
        assert page.status_code == 401 and "revoked" in page.text and 'id="token"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]


def test_every_grafana_query_names_a_metric_the_gateway_exports(gateway: Gateway) -> None:
    with gateway.http() as h:  # something in each family: a job, a refusal, an audit check
        job = h.post("/v1/jobs", json={"command": "true"}).json()
        h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        h.get("/dashboard")
    with httpx.Client(base_url=gateway.url) as c:
        c.post("/dashboard/login", data={"token": gateway.admin_token})
        c.get("/dashboard/live.json")
    text = httpx.get(f"{gateway.url}/metrics").text
    # samples, and families declared without one yet (no live job: no corral_jobs sample; no
    # controller behind the local backend: no corral_controller_calls_total sample)
    exported = set(re.findall(r"^(corral_[a-z_]+?)(?:\{| )", text, re.M)) | set(
        re.findall(r"^# TYPE (corral_[a-z_]+) (?:gauge|counter)", text, re.M))
    board = json.loads((DOCS / "grafana-corral.json").read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert len(exprs) >= 12
    for expr in exprs:
        for name in re.findall(r"\b(corral_[a-z_]+)", expr):
            assert name in exported, f"{name} (in {expr!r}) is not on /metrics"
    # what the dashboard shows is there too
    for family in ("corral_jobs_submitted_total", "corral_decisions_total", "corral_sessions_active",
                   "corral_fastlane_tasks_total", "corral_audit_chain_ok", "corral_tainted_credentials",
                   "corral_controller_calls_total"):
        assert family in exported, family


def test_the_plots_figures_from_jobs_times(tmp_path: Path) -> None:
    """An extra, beside the browser test: History over a real database of jobs with
    chosen times gives the exact figures, fractions of a minute included (the gateway
    around it is stood in for by its database and a 4-CPU backend)."""
    from types import SimpleNamespace

    from corral.lanes.backend import Partition
    from corral.edges.dashboard.history import BUCKET_S, History
    from corral.core.db import Database
    from corral.gateway.board_reads import BoardReads
    from corral.core.principals import PILOT_PRINCIPAL

    db = Database(tmp_path / "corral.db")
    now = 1_800_000_000.0
    m = BUCKET_S
    db.conn.executemany("INSERT INTO principals (name, kind, sponsor, created) VALUES (?, ?, NULL, ?)",
                        [("ann", "human", now), ("bot", "agent", now), (PILOT_PRINCIPAL, "service", now)])
    jobs = [  # principal, lane, state, submit, start, end, cpus
        ("ann", "local", "COMPLETED", now - 10 * m, now - 9.5 * m, now - 7.5 * m, 2),  # ran 2 minutes
        ("bot", "local", "RUNNING", now - 3 * m, now - 2.25 * m, None, 1),  # running since 2m15s ago
        ("bot", "local", "PENDING", now - 0.5 * m, None, None, 4),  # waiting now
        ("bot", "fast", "COMPLETED", now - 4 * m, now - 4 * m, now - 3.9 * m, 1),  # inside an allocation
        (PILOT_PRINCIPAL, "local", "RUNNING", now - 5 * m, now - 5 * m, None, 1),  # the allocation
    ]
    db.conn.executemany(
        "INSERT INTO jobs (principal, session, backend, backend_id, state, submit_time, start_time, end_time, spec) "
        "VALUES (?, NULL, ?, 'x', ?, ?, ?, ?, ?)",
        [(w, lane, st, s, b, e, json.dumps({"command": "true", "cpus": c})) for w, lane, st, s, b, e, c in jobs])
    backend = SimpleNamespace(partitions=lambda: [Partition("local", 4, 8000, 0, 3600, default=True)])
    service = SimpleNamespace(db=db, lanes=SimpleNamespace(batch=SimpleNamespace(backend=backend, name="local")),
                              board_figures=SimpleNamespace(over=lambda since: []),  # no saved samples yet
                              audit=SimpleNamespace(log=SimpleNamespace(path=tmp_path / "audit.log")))
    svg = History(BoardReads(service)).plots(now, None)  # type: ignore[arg-type]

    def lines(name: str) -> dict[str, list[float]]:
        return {k: [float(x) for x in v.split(",")] for k, v in
                re.findall(r'<polyline [^>]*data-series="([^"]+)" data-values="([^"]+)"', svg[name])}

    last = lambda k: k[-12:]  # the last 12 minutes, oldest first # noqa: E731
    subs = lines("submissions")
    # minute k of these 12 is (now - (12 - k) min, now - (11 - k) min]
    assert last(subs["human"]) == [0, 1] + [0] * 10
    assert last(subs["agent"]) == [0] * 7 + [1, 1, 0, 0, 1]
    util = lines("utilisation")["CPUs held by jobs"]
    # ann's 2 CPUs: half of minute -10..-9, all of -9..-8, half of -8..-7, of 4 CPUs; the
    # pilot's 1 CPU from -5 on; bot's 1 CPU from -2.25 on; the fast task not again.
    assert last(util) == [0, 0, 25, 50, 25, 0, 0, 25, 25, 31.2, 50, 50], last(util)  # 31.25: bot a quarter
    queue = lines("queue")
    # waiting at a minute's end: ann's job at -10 min, bot's at -3 min, the pending one now
    assert last(queue["local"]) == [0, 1] + [0] * 6 + [1, 0, 0, 1] and not any(queue["fast"])
    states = lines("states")
    assert last(states["COMPLETED"]) == [0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    assert last(states["PENDING"])[-1] == 1 and last(states["RUNNING"])[-1] == 1
    db.close()
