"""Issue 54, the analytics report and the simulator's as an admin reads them, in real
Chromium: each page's figures are the CLI's ``--json`` figures; degenerate inputs (a
trace without users, one-core nodes, a one-day export, a share without agents) are
said on the page and in the terminal, not drawn; a table never shows a figure where
its plot has none; one unit per row; lines that overlap both show; legends fit. Each
page is kept as a 1400 px wide screenshot (tests/test_admins_read_dashboard.artifacts)."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench._common import shared_data

from .test_admins_read_dashboard import WIDE, browser, shoot  # noqa: F401 (browser: the fixture)
from .test_storage import gw, needs_root, needs_tools, shared  # noqa: F401 (gw, shared: the fixtures)

TRACES = shared_data("traces")
COARE = TRACES / "DOST-ASTI-COARE-Saliksik-2020-cln.swf"
LUBLIN = TRACES / "lublin_256.swf"


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})


def _open(chromium: Any, path: Path) -> Iterator[Any]:
    context = chromium.new_context(viewport=WIDE)
    try:
        page = context.new_page()
        page.goto(path.as_uri())
        yield page
    finally:
        context.close()


def _one_day_export(tmp_path: Path) -> Path:
    week = tmp_path / "week.txt"
    assert corral("synth", "--out", str(week), "--days", "7", "--jobs", "3000", "--users", "30").returncode == 0
    lines = week.read_text().splitlines()
    day = lines[1].split("|")[5][:10]
    out = tmp_path / "oneday.txt"
    out.write_text("\n".join([lines[0]] + [ln for ln in lines[1:] if ln.split("|")[5].startswith(day)]) + "\n")
    return out


def test_the_analytics_report_reads_as_the_cli_says(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    one_day = _one_day_export(tmp_path)
    for name, src in (("one-day", one_day), ("coare", COARE)):
        page_file = tmp_path / f"{name}.html"
        cp = corral("analyze", str(src), "--html", str(page_file), "--json")
        assert cp.returncode == 0, cp.stderr
        r = json.loads(cp.stdout)
        human = corral("analyze", str(src)).stdout
        c = r["classification"]
        flag = f"would flag {c['behaviour_would_flag']:,} of {c['users']:,} users"
        assert flag in " ".join(human.split()), human  # the terminal says it, as docs/analytics.md promises
        for page in _open(browser, page_file):
            assert flag in page.locator("#would-flag").inner_text()
            cards = page.locator("#cards .card").all_inner_texts()
            for (key, _), text in zip((("user_share", 0), ("submission_share", 0), ("core_hour_share", 0),
                                       ("gpu_hour_share", 0)), cards):
                v = r["agents"][key]
                assert text.startswith("—" if v is None else f"{v:.1%}"), (key, v, text)
            bars = page.evaluate("[...document.querySelectorAll('svg.bars text')].map(t => t.textContent)")
            if r["agents"]["gpu_hour_share"] is None:  # none in the export: said, on the card and the bar alike
                assert "no GPU-hours" in cards[3] and any("no GPU-hours" in t for t in bars), bars
                assert not any(t == "0.0%" for t in bars[bars.index("GPU-hours"):]), bars
            # the heatmaps' colour scales: every label inside its picture
            clipped = page.evaluate("""[...document.querySelectorAll('svg.heat-scale')].flatMap(s =>
                [...s.querySelectorAll('text')].filter(t => t.getBBox().x + t.getBBox().width > s.width.baseVal.value)
                .map(t => t.textContent))""")
            assert clipped == [], clipped
            _groups_table_reads_as_the_json_says(page, r)
            _plots_read_at_a_glance(page)
            if name == "one-day":
                assert page.locator("#no-over-time").count() == 1 and page.locator("svg.ts").count() == 0
                assert any("one day" in w for w in r["source"]["warnings"])
                assert "warning: the export covers one day" in " ".join(human.split())
                assert "covers 1 day" in page.locator("#short-week").inner_text()  # the empty weekdays said
            else:
                gpu = any(d["gpu_hours"] for d in r["tables"]["daily"])
                assert page.locator("svg.ts").count() >= 2 + gpu and page.locator("#no-gpu-hours").count() == (not gpu)
                assert page.locator("#short-week").count() == 0
            assert _clipped(page) == [], _clipped(page)  # every label inside its picture
            shoot(page, f"analytics-{name}")


def _groups_table_reads_as_the_json_says(page: Any, r: dict[str, Any]) -> None:
    """Agents and humans side by side: each cell is the JSON's figure, in the row's format."""
    from corral.analytics.render import ROWS

    shown = {row[0]: row[1:] for row in page.evaluate(
        "[...document.querySelectorAll('#groups tr')].slice(1).map(r => [...r.querySelectorAll('td')].map(c => c.textContent))")}
    for label, key, fmt in ROWS:
        want = ["—" if r["groups"][g].get(key) is None else fmt.format(r["groups"][g][key]) for g in ("agent", "human")]
        assert shown[label] == want, (label, shown[label], want)


def _plots_read_at_a_glance(page: Any) -> None:
    """Each plot has a title; its value ticks are round (a 1-2-5 step from 0), its dates
    round dates (a month's first, a Monday, a day)."""
    plots = page.evaluate("""[...document.querySelectorAll('svg.ts, svg.hist, svg.scatter')].map(s => ({
        title: (s.querySelector('text.title') || {}).textContent || '',
        ticks: [...s.querySelectorAll('text.small[text-anchor=end]')].map(t => t.textContent),
        dates: s.matches('.ts') ? [...s.querySelectorAll('text.small[text-anchor=middle]')].map(t => t.textContent)
                                  .filter(t => t !== 'date') : []}))""")
    assert plots
    for p in plots:
        assert len(p["title"]) > 15, p
        values = [float(t.rstrip("%").replace("k", "e3").replace("M", "e6").replace(",", "")) for t in p["ticks"]]
        steps = {round(b - a, 9) for a, b in zip(values, values[1:])}
        assert values[0] == 0 and len(steps) == 1, p
        step = steps.pop()
        assert round(step / 10 ** math.floor(math.log10(step)), 9) in (1, 2, 5), p
        for d in p["dates"]:
            assert re.fullmatch(r"[A-Z][a-z]{2}( \d{2}| \d{4})?", d), p


def _clipped(page: Any) -> list[str]:
    """Texts of a page's plots that reach outside their picture (a clipped legend, title or
    tick), measured where the browser draws them (rotations and shifts included)."""
    return page.evaluate("""[...document.querySelectorAll('svg')].flatMap(s => {
        const box = s.getBoundingClientRect();
        return [...s.querySelectorAll('text')].filter(t => {
            const r = t.getBoundingClientRect();
            return r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1
                                   || r.bottom > box.bottom + 1);
        }).map(t => t.textContent); })""")


def _seconds(cell: str) -> float | None:
    if cell == "no data":
        return None
    m = re.fullmatch(r"([\d,.]+) (ms|s|min|h)", cell)
    assert m, cell
    return float(m.group(1).replace(",", "")) * {"ms": 1e-3, "s": 1, "min": 60, "h": 3600}[m.group(2)]


CONTROLLER = {"controller RPCs/s": lambda f: f["controller"]["rpc_per_s"],
              "controller busy": lambda f: f["controller"]["utilisation"] * 100}
"""The simulator's controller rows, from its JSON (busy in percent, as the table says it)."""


def test_the_simulators_page_reads_as_the_cli_says(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """A trace without users on its own machine of one-core nodes, and a sweep whose
    shares all give one agent: warned of everywhere; the table's figures are the JSON's,
    one unit a row, "no data" where the plot has none; every policy's line shows."""
    page_file = tmp_path / "sim.html"
    args = ("simulate", "--trace", str(LUBLIN), "--policies", "plain,corral-new,ban", "--sweep", "0.1,0.3")
    cp = corral(*args, "--html", str(page_file), "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    about = {w["about"] for w in r["warnings"]}
    assert {"no users", "one core per node", "shares give the same agents"} <= about, about
    text = " ".join(corral(*args).stdout.split())  # the terminal says the same
    for w in r["warnings"]:
        assert f"warning ({w['about']}): {' '.join(w['says'].split())}" in text, w["about"]
    assert "1 person," in text and "1 people" not in text
    pols = r["policies"]
    for page in _open(browser, page_file):
        assert {p.get_attribute("data-about") for p in page.locator("p.warn").all()} == about
        rows = page.evaluate("""[...document.querySelectorAll('#figures tr[data-row]')].map(r =>
            [r.getAttribute('data-row'), [...r.querySelectorAll('td')].slice(1).map(c => c.textContent)])""")
        figures = {"people's wait p90": ("people_wait_s", "p90"), "agents' loop, short jobs p50": ("agent_loop_short_s", "p50")}
        for label, cells in rows:
            units = {c.split(" ")[-1] for c in cells if re.fullmatch(r"[\d,.]+ (ms|s|min|h)", c) and c != "0 s"}
            assert len(units) <= 1, (label, cells)  # one unit a row
            if label in CONTROLLER:  # small, not nothing: a figure the plot shows is never 0.00 in the table
                for f, cell in zip(pols.values(), cells):
                    want, got = CONTROLLER[label](f), float(cell.rstrip("%").replace(",", ""))
                    assert (got == 0) == (want == 0) and abs(got - want) <= 0.05 * want, (label, cell, want)
            if label in figures:
                key, q = figures[label]
                for f, cell in zip(pols.values(), cells):
                    want = f[key][q] if f[key]["n"] else None
                    got = _seconds(cell)
                    assert (got is None) == (want is None), (label, cell, want)
                    if want is not None:
                        assert abs(got - want) <= max(0.05 * want, 0.05), (label, cell, want)
        # every share gives the same one agent: no plot against the share (flat lines read as a trend), said
        assert "repeat one run" in page.locator("#no-sweep-plots").inner_text()
        assert page.locator("svg[aria-label*='against agents']").count() == 0
        sweep = page.evaluate("[...document.querySelectorAll('#sweep tr')].slice(1).map(r => "
                              "[...r.querySelectorAll('td')].map(c => c.textContent))")
        assert len(sweep) == len(r["sweep"])
        # every figure of both tables: the JSON's, in the report's one format for it
        from corral.simulate.report import ROWS, row_cells, sweep_cells

        assert dict(rows) == {label: row_cells(get, kind, list(pols.values())) for label, get, kind in ROWS}
        assert sweep == sweep_cells(r["sweep"])
        for row, cells in zip(r["sweep"], sweep):
            if not row["agents"]:
                assert cells[5] == "no data" and cells[6] == "no data", cells  # never 0.0 ms
        # lines drawn so that each shows: its own colour, dash and markers
        for svg in page.locator("svg[role=img]").all():
            looks = svg.evaluate("s => [...s.querySelectorAll('polyline.series')].map(l => "
                                 "[l.getAttribute('stroke'), l.getAttribute('stroke-dasharray') || ''])")
            assert len({tuple(x) for x in looks}) == len(looks), looks
            assert len({x[1] for x in looks}) == len(looks), looks
        assert _clipped(page) == [], _clipped(page)  # every label inside its picture
        shoot(page, "simulate-lublin")


def test_on_coares_trace_the_simulator_says_why_its_wait_is_not_the_recorded_one(tmp_path: Path,
                                                                               browser: Any) -> None:  # noqa: F811
    """COARE's header names 24 nodes of its 1,728 processors and 4 partitions; its jobs
    waited p90 7,617 s (what analyze reports). The simulation reads its nodes, and says
    why its pool of all the cores hardly queues them."""
    page_file = tmp_path / "coare.html"
    cp = corral("simulate", "--trace", str(COARE), "--policies", "ban", "--html", str(page_file), "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    fac = r["scenario"]["facility"]
    assert (fac["nodes"], fac["cores"]) == (24, 1728)
    recorded = json.loads(corral("analyze", str(COARE), "--json").stdout)["groups"]["human"]["wait_p90_s"]
    assert r["scenario"]["trace"]["recorded_wait_p90_s"] == recorded == 7617.0
    w = next(w for w in r["warnings"] if w["about"] == "simulated wait is not the recorded wait")
    assert "2.1 h" in w["says"] and "4 partitions" in w["says"] and "--facility" in w["says"]
    for page in _open(browser, page_file):
        assert "2.1 h" in page.locator("p.warn").inner_text()
        assert _clipped(page) == [], _clipped(page)  # every label inside its picture
        shoot(page, "simulate-coare")


def _on_a_terminal(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> tuple[str, str]:
    """The command with its stderr on a pseudo-terminal (as a person runs it) and its
    stdout on a pipe: -> (what the terminal showed, stdout)."""
    import tempfile

    master, slave = pty.openpty()
    sink = tempfile.TemporaryFile()  # not a pipe we would have to drain while we read the terminal
    p = subprocess.Popen([sys.executable, "-m", "corral.edges.cli.main", *args], stdout=sink,
                         stderr=slave, env={**(env or os.environ), "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=60)
    os.close(master)
    sink.seek(0)
    return seen.decode(errors="replace"), sink.read().decode()


def test_long_runs_show_a_bar_on_a_terminal_and_nothing_on_a_pipe(tmp_path: Path) -> None:
    for args in (("analyze", str(COARE)), ("simulate", "--trace", str(COARE), "--policies", "ban")):
        shown, out = _on_a_terminal(*args)
        assert "━" in shown, shown[-500:]  # a bar (rich's), not a spinner alone
        piped = corral(*args)
        assert piped.returncode == 0 and "━" not in piped.stderr and piped.stderr.strip() == "", piped.stderr[-300:]
        quiet, _ = _on_a_terminal(*args, "--json")
        assert "━" not in quiet  # --json: nothing but the JSON


def test_a_share_that_gives_no_agents_is_said_not_drawn(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """Issue 54 item 2's fourth degenerate input: an agents' share of 0 (alone, or in a
    sweep) gives no agents; the terminal, the JSON and the page say what cannot be
    measured and what to give instead, and no agents' figure is drawn as a zero."""
    page_file = tmp_path / "none.html"
    args = ("simulate", "--facility", "small", "--days", "1", "--people", "10", "--agent-share", "0",
            "--policies", "plain")
    cp = corral(*args, "--html", str(page_file), "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    said = next(w for w in r["warnings"] if w["about"] == "no agents")
    assert "cannot be measured" in said["says"] and "--agent-share above" in said["says"], said
    assert f"warning (no agents): {' '.join(said['says'].split())}" in " ".join(corral(*args).stdout.split())
    for page in _open(browser, page_file):
        assert page.locator("p.warn[data-about='no agents']").count() == 1
        rows = dict(page.evaluate("""[...document.querySelectorAll('#figures tr[data-row]')].map(r =>
            [r.getAttribute('data-row'), r.querySelector('td:nth-child(2)').textContent])"""))
        for label in ("agents' loop, short jobs p50", "agents' loop, short jobs p90", "agents' results/h"):
            assert rows[label] == "no data", (label, rows[label])
        assert page.locator("svg[aria-label^=\"Agents' results per hour\"]").count() == 0
        # the controller's load is small, not nothing: the table's figure is the JSON's (was 0% beside a
        # line drawn at the plot's 0.001% floor), and the plot's scale reaches down to it
        busy = r["policies"]["plain"]["controller"]["utilisation"] * 100
        assert busy > 0 and float(rows["controller busy"].rstrip("%")) == pytest.approx(busy, rel=0.05), rows
        shown = page.evaluate("""[...document.querySelector("svg[aria-label^='Controller busy']")
            .querySelectorAll('text.tick.y')].map(t => t.textContent)""")
        assert min(float(t.rstrip("%")) for t in shown) <= busy and not any("e-" in t for t in shown), (shown, busy)
        assert _clipped(page) == [], _clipped(page)  # every label inside its picture
        shoot(page, "simulate-no-agents")
    swept = json.loads(corral("simulate", "--facility", "small", "--days", "1", "--people", "10", "--sweep", "0,0.5",
                              "--policies", "plain", "--json").stdout)
    assert any(w["about"] == "no agents" and "0%" in w["says"] for w in swept["warnings"]), swept["warnings"]


@needs_tools
@needs_root
def test_an_env_build_shows_a_bar_on_a_terminal_and_nothing_on_a_pipe(gw: Any, tmp_path: Path) -> None:  # noqa: F811
    """Item 4's third long run: ``corral env build`` draws its steps on a terminal, writes
    nothing to stderr on a pipe, and keeps --json one object. Three builds of different
    files, so that none is answered at once by the image of another."""
    g, t = gw
    env = g.env(t["bot1"])

    def requirements(pin: str) -> str:
        d = tmp_path / pin
        d.mkdir()
        (d / "requirements.txt").write_text(f"six=={pin}\n")
        return str(d / "requirements.txt")

    shown, out = _on_a_terminal("env", "build", requirements("1.16.0"), env=env)
    assert "\u2501" in shown and "env build" in shown, shown[-500:]  # a bar (rich's), naming what it does
    assert "six==1.16.0" in out, out
    piped = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "env", "build", requirements("1.15.0")],
                           capture_output=True, text=True, env=env, timeout=600)
    assert piped.returncode == 0 and piped.stderr == "" and "six==1.15.0" in piped.stdout, piped
    quiet, out = _on_a_terminal("--json", "env", "build", requirements("1.14.0"), env=env)
    assert "\u2501" not in quiet and json.loads(out)["state"] == "ready", (quiet[-300:], out)


def test_a_policy_at_zero_throughout_is_said_not_drawn_on_a_log_scale() -> None:
    """A log scale cannot place 0: a policy whose controller load is 0 all run is named
    under the plot, not drawn along its floor; the others are drawn down to their least."""
    from corral.simulate import axes, report

    said = report._log_plot({"ban": [(0.0, 0.0), (1.0, 0.0)], "plain": [(0.0, 2e-6), (1.0, 4e-6)]},
                            "Controller busy: share of its time serving RPCs", axes.days_axis(1.0),
                            "share of time busy (log scale)", 1e-5, percent=True)
    assert len(said) == 2 and "ban at 0 throughout" in said[1] and "not drawn" in said[1]
    assert "ban" not in said[0] and "plain" in said[0]
    assert report._log_plot({"ban": [(0.0, 0.0)]}, "Controller load", axes.days_axis(1.0), "RPCs", 1e-3) == [
        '<p class="note zero" data-about="Controller load">Controller load: ban at 0 throughout, which a log scale '
        "cannot place: not drawn.</p>"]

