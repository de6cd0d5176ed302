"""Shared fixtures: a real gateway process on a loopback port, the real CLI against it
(in-process), and turns on the real Slurm."""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from . import slurm_env
from .slurm_env import turn_lock

# Bytecode is cached for this session's Python processes. Under PYTHONDONTWRITEBYTECODE=1
# (set where the suite ran in CI rehearsals) and a venv installed by uv (which compiles
# nothing by default), every gateway, CLI and shim the tests start compiled some 550
# modules from source again: 0.7 s more per gateway start on a quiet machine, more on a
# loaded one (docs/benchmarks.md, test suite). Caches lie in __pycache__ (git ignores them).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def free_port() -> int:
    """A free loopback port, below the kernel's ephemeral range (so no outgoing connection
    holds it) and in a block of its own per pytest-xdist worker: two workers never race
    for one port between this probe and the gateway's bind. (Not bind-to-0 filtered by
    residue: Linux hands bind() even ports only.) Never one it handed out in the last
    hundred: a test that asks for two ports before binding either (a gateway's and its
    egress proxy's) got the same one, and the gateway could not bind (seen in CI)."""
    i = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    block = 20_000 + (i % 6) * 2_000
    for port in random.Random().sample(range(block, block + 2_000), 2_000):
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED.append(port)
            return port
    raise RuntimeError(f"no free loopback port in {block}-{block + 1999}")


_HANDED: collections.deque[int] = collections.deque(maxlen=100)
"""The ports free_port handed out last, perhaps not bound yet."""


_UIDS_DIR = tempfile.mkdtemp(prefix="corral-uids-")
atexit.register(shutil.rmtree, _UIDS_DIR, True)
TEST_UIDS = os.path.join(_UIDS_DIR, "uids")
"""The machine's record of dynamic uids for this test process's gateways: shared by
them, as by installs on one machine, and not the machine's own (/var/lib/corral/uids),
whose uids are never given back and would run out over many test runs."""
TEST_NSS = os.path.join(_UIDS_DIR, "extrausers")
"""Where this test process's gateways publish dynamic uids for NSS ([sandbox] nss_users):
a directory no NSS reads, so their Slurm jobs start as root and drop to the uid, and the
machine's own /var/lib/extrausers is written only by the tests that ask for it (a uid
published there is skipped by every later allocation: test runs would use up the range)."""


@dataclass
class Gateway:
    home: Path
    port: int
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    cpus: int = 2
    prefix: list[str] = field(default_factory=list)
    """What the gateway's command runs under (nsenter into a test's namespace: tests/ldap_env.py)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def env(self, token: str | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update({"CORRAL_HOME": str(self.home), "CORRAL_URL": self.url,
                    "CORRAL_SANDBOX__UID_REGISTRY": TEST_UIDS,
                    "CORRAL_SANDBOX__NSS_USERS": TEST_NSS, **self.extra_env, **extra})
        if token:
            env["CORRAL_TOKEN"] = token
        return env

    def start(self) -> None:
        log = open(self.home.parent / f"gateway-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            # 2 CPU slots whatever the machine (unless a test says): tests that fill the slots mean this many.
            [*self.prefix, sys.executable, "-m", "corral.edges.cli.main", "serve", "--port", str(self.port), "--tick", "0.2",
             "--cpus", str(self.cpus)],
            env=self.env(), stdout=log, stderr=log, cwd=self.home.parent,
        )
        deadline = time.monotonic() + 90  # a loaded machine starts a gateway slowly
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {(self.home.parent / f'gateway-{self.port}.log').read_text()}")
            time.sleep(0.1)
        raise RuntimeError("gateway did not start")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                # Still an error for the test, but no gateway is left running to disturb the next
                # ones; its stacks go to its log first (the gateway dumps them on SIGUSR1).
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(1)
                self.proc.kill()
                self.proc.wait(10)
                raise

    def metric(self, name: str) -> float:
        """A value on the gateway's /metrics (0 when absent)."""
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def http(self, token: str | None = None, session: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        if session:
            headers["X-Corral-Session"] = session
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def cli(self, *args: str, token: str | None = None, input: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        """``corral ARGS`` against this gateway, as a user runs it, in this process (click's
        runner: the command, its environment, its working directory and its exit code as a
        process would have them; a process of its own is not what these tests are about).
        ``agent`` runs a process of its own, as it does for users."""
        full = self.env(token, **env)
        if args and args[0] == "agent":
            return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", *args], env=full,
                                  capture_output=True, text=True, input=input, timeout=120, cwd=self.home.parent)
        return cli_in_process(list(args), full, self.home.parent, input)

    def cli_json(self, *args: str, token: str | None = None) -> Any:
        cp = self.cli("--json", *args, token=token)
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)


def cli_in_process(args: list[str], env: dict[str, str], cwd: Path,
                   input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``corral ARGS`` through click's runner, with exactly ``env`` as its environment (what a
    process started with it would see: the rest of this one's unset, a terminal 80 columns
    wide as for a process whose output is a pipe) and ``cwd`` as its directory."""
    from click.testing import CliRunner

    from corral.edges.cli.main import cli

    shown = {"COLUMNS": "80", "LINES": "24", **env}
    patch: dict[str, str | None] = {**{k: None for k in os.environ if k not in shown}, **shown}
    before = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli, args, input=input, env=patch, prog_name="corral")
    finally:
        os.chdir(before)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(["corral", *args], r.exit_code, r.stdout, r.stderr)


@contextlib.contextmanager
def slurm_lock(shared: bool = False) -> Iterator[None]:
    """A turn on the current test's private Slurm (one lock per instance: tests/slurm_env.py),
    across pytest-xdist workers and test sessions: shared with other tests holding a shared
    turn, or alone (exclusive). (xdist's --dist loadgroup would group them, but it marks
    groups by rewriting node ids, which pytest 9 ignores: the group ran on both workers.)"""
    import fcntl

    lock = turn_lock(slurm_env.current())
    # Through a turnstile (a second lock, held while the turn is awaited): a test waiting to
    # run alone holds it, so no new shared turn begins meanwhile (flock itself prefers no one,
    # and the two workers' shared turns could overlap without end).
    with open(lock + ".gate", "w") as gate, open(lock, "w") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@pytest.fixture
def slurm_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """A real-Slurm test's turn (docs/decisions/0031). Alone by default: some tests stop
    slurmctld, reconfigure it, fill its node or count its free CPUs. A test marked
    ``@pytest.mark.slurm_turn("shared")`` only runs a few small jobs of its own (a few
    CPUs of the node's 32, never all) and reads only those: it runs beside another such
    test, on the other worker, instead of waiting for it. ``slurm_turn("none")``: a test of a
    Slurm module that asks Slurm nothing takes no turn."""
    marker = request.node.get_closest_marker("slurm_turn")
    how = marker.args[0] if marker and marker.args else "alone"
    if how == "none":
        yield
        return
    with slurm_lock(shared=how == "shared"):
        yield


SHARED_TURN = pytest.mark.slurm_turn("shared")
"""The mark of a real-Slurm test that may share its turn (see slurm_turn)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm_turn(how): 'shared' lets a real-Slurm test run beside another "
                                       "shared one, 'none' takes no turn (tests/conftest.py::slurm_turn); "
                                       "unmarked tests run alone")


def ended(pid: int, within: float = 10.0) -> bool:
    """Wait for a process that is not our child to end (gone, or a zombie its parent has
    not reaped): -> whether it did within this many seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def running(tmp_path: Path, cpus: int = 2, **env: str) -> Iterator[Gateway]:
    """A gateway of the test's own (``env``: CORRAL_* settings), stopped afterwards."""
    gw = Gateway(tmp_path / "home", free_port(), extra_env=env, cpus=cpus)
    gw.home.mkdir()
    gw.start()
    try:
        yield gw
    finally:
        gw.kill(signal.SIGTERM)
        drop_scratch(gw.home, env.get("CORRAL_STORAGE_SCRATCH"))


@contextlib.contextmanager
def file_server(root: Path, host: str, text: str) -> Iterator[int]:
    """A web server of one file, ``ok.txt``, on ``host`` (a host an egress allow-list may
    name): -> its port, once it answers; stopped afterwards."""
    root.mkdir()
    (root / "ok.txt").write_text(text)
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", host], cwd=root,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((host, port), 0.5).close()
                break
            except OSError:
                assert srv.poll() is None and time.monotonic() < deadline, f"no web server on {host}:{port}"
                time.sleep(0.1)
        yield port
    finally:
        srv.kill()
        srv.wait()


def drop_scratch(home: Path, scratch: str | None = None) -> None:
    """A test gateway's node-local scratch (corral/storage): its images and workspaces
    unmounted, the directory removed (it lies outside tmp_path, in /var/tmp)."""
    import shutil

    from corral.core.config import StorageSettings
    from corral.storage.mounts import unmount_all
    from corral.gateway.storage_verbs import scratch_dir

    root = Path(scratch) if scratch else scratch_dir(StorageSettings(), home.resolve())
    unmount_all(root)
    if not scratch:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def gateway(tmp_path):
    with running(tmp_path) as gw:
        yield gw


@pytest.fixture(autouse=True)
def _reachable_tmp_path(request: pytest.FixtureRequest) -> None:
    """Under a root gateway every principal without a Unix user runs as a dynamic uid of
    its own (corral/core/identity.py), and a job's working directory must be one it may write:
    a test's tmp_path (root's, 0700, under 0700 parents) is made traversable and
    writable, as a project directory people share would be."""
    if "tmp_path" not in request.fixturenames or os.geteuid() != 0:
        return
    tmp = request.getfixturevalue("tmp_path")
    tmp.chmod(0o777)
    for parent in tmp.parents:  # pytest-of-root/pytest-N[/popen-gwK]: each 0700, root's
        if not parent.name.startswith(("pytest-", "popen-gw")):
            break
        parent.chmod(0o711)


@pytest.fixture
def agent_dir() -> Iterator[Path]:
    """A working directory an agent's job can use: it runs sandboxed, and under a root
    gateway as an unprivileged user, who can neither enter pytest's tmp_path (0700,
    root's) nor write there."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="corral-agent-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def add_people(gateway: Gateway, bot2_sponsor: str = "alice", expires: str = "1h") -> dict[str, str]:
    """alice (human) sponsoring agent bot1, carol (human), and agent bot2 sponsored by
    ``bot2_sponsor``. -> name: token."""
    with gateway.http() as h:
        for body in ({"name": "alice", "kind": "human"}, {"name": "carol", "kind": "human"},
                     {"name": "bot1", "kind": "agent", "sponsor": "alice"},
                     {"name": "bot2", "kind": "agent", "sponsor": bot2_sponsor}):
            assert h.post("/v1/principals", json=body).status_code == 201
        return {n: h.post("/v1/tokens", json={"for": n, "expires": expires}).json()["token"]
                for n in ("alice", "carol", "bot1", "bot2")}


@pytest.fixture
def people(gateway: Gateway) -> dict[str, str]:
    """alice (human) sponsoring agents bot1 and bot2; carol (human) unrelated. -> name: token."""
    return add_people(gateway)


_SCRATCH_BEFORE: set[str] = set()
"""The /var/tmp/corral-* directories that existed before this session: not ours to remove
(another session's, or a real gateway's on this machine)."""


def pytest_sessionstart(session: pytest.Session) -> None:
    _SCRATCH_BEFORE.update(p.name for p in Path("/var/tmp").glob("corral-*"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every gateway a test started made its node-local scratch in /var/tmp (corral/storage):
    those this session made and left empty and unmounted (most never held an image or a
    workspace) are removed; none that was there before it."""
    import re
    import shutil

    from corral.storage.mounts import under

    if hasattr(session.config, "workerinput"):  # the controller tidies once, after every worker
        return
    for d in Path("/var/tmp").glob("corral-*"):
        if re.fullmatch(r"corral-[0-9a-f]{10}", d.name) and d.name not in _SCRATCH_BEFORE and not under(d) \
                and not any(p.is_file() for p in d.rglob("*")):
            shutil.rmtree(d, ignore_errors=True)



SLURM_FILES = {f"tests/{name}.py" for name in (
    "test_backend_slurm", "test_gateway_slurm", "test_cluster_slurm", "test_preemption_slurm", "test_privsep_slurm",
    "test_privsep_submit", "test_slurm_control", "test_cluster_workspaces", "test_compat")}
"""Test files whose tests take turns on the private Slurm (slurm_turn; test_compat's corpus
takes one for the module): run on one worker."""
SLURM_TESTS = {
    "tests/test_approvals_slurm.py::test_an_approved_job_runs_in_slurm_with_its_sponsors_slurm_mail_and_an_unanswered_one_expires",
    "tests/test_approvals_slurm.py::test_on_slurm_the_link_and_the_dashboard_each_release_a_held_job",
    "tests/test_backup.py::test_a_backup_restored_on_a_fresh_home_verifies_and_reconciles_slurm",
    "tests/test_bounds_hold.py::test_a_contained_batch_job_works_in_its_bounded_tmp_on_slurm",
    "tests/test_clusters_loss_slurm.py::test_a_clusters_preemptions_cost_its_expected_loss_and_a_refusal_names_each_clusters_nearest",
    "tests/test_clusters_fastlane.py::test_a_task_for_cluster_two_runs_in_its_pool_on_a_node_of_cluster_two",
    "tests/test_clusters_fastlane.py::test_cluster_ones_controller_down_leaves_cluster_twos_pool_serving",
    "tests/test_clusters_rebalance.py::test_a_gateway_killed_in_a_move_loses_nothing_and_runs_nothing_twice",
    "tests/test_clusters_rebalance.py::test_a_job_being_moved_is_not_released_between_its_hold_and_its_cancel",
    "tests/test_clusters_rebalance.py::test_a_pending_job_is_moved_to_the_free_cluster_and_runs_once",
    "tests/test_clusters_rebalance.py::test_a_rule_naming_a_cluster_keeps_agents_off_it",
    "tests/test_clusters_rebalance.py::test_a_sponsors_budget_on_a_cluster_keeps_a_job_that_would_pass_it_off",
    "tests/test_clusters_rebalance.py::test_data_a_cluster_does_not_mount_keeps_a_job_off_it",
    "tests/test_clusters_slurm.py::test_one_clusters_controller_down_leaves_the_other_serving",
    "tests/test_clusters_slurm.py::test_placement_sends_an_agents_job_to_the_free_cluster",
    "tests/test_bounds_reads.py::test_fifos_and_links_in_a_job_directory_never_stall_the_gateway",
    "tests/test_doctor.py::test_a_good_host_passes_against_the_private_slurm",
    "tests/test_egress_approvals_slurm.py::test_on_slurm_an_approved_egress_reaches_its_host_through_the_nodes_relay",
    "tests/test_dashboard.py::test_what_corral_saved_a_real_slurm_is_counted_in_its_commands",
    "tests/test_admins_read_dashboard.py::test_what_corral_asked_slurm_reads_as_corral_saved_says",
    "tests/test_fastlane.py::test_a_batch_job_gets_the_cores_of_an_idle_pool_and_a_task_says_it_waits_for_it",
    "tests/test_job_slurm_commands.py::test_slurms_commands_inside_a_job_answer_about_it_on_every_node",
    "tests/test_mcp_said_up_front.py::test_the_issues_request_on_slurm_is_planned_in_one_call",
    "tests/test_notify_idle.py::test_on_slurm_an_idle_job_is_told_from_sstat",
    "tests/test_shims.py::test_the_fence_leaves_corral_the_only_way_to_slurm",
    "tests/test_simulate.py::test_calibration_reads_the_real_controller",
    "tests/test_simulate.py::test_calibration_leaves_the_controllers_statistics_as_they_were",
    "tests/test_slurm_conventions.py::test_the_shims_print_what_the_job_asked",
    "tests/test_slurm_plugin.py::test_agents_reach_slurm_through_corral_only",
    "tests/test_storage.py::test_images_and_workspaces_on_the_private_slurm",
    "tests/test_superseded_run.py::test_an_orphaned_runs_end_does_not_end_a_requeued_job",
    "tests/test_superseded_run.py::test_an_end_recorded_before_slurm_requeues_the_job_is_reopened",
    "tests/test_superseded_run.py::test_a_job_ending_as_the_primary_controller_dies_is_reopened_when_the_backup_requeues_it",
    "tests/test_wheel.py::test_the_installed_gateway_checks_the_host_and_runs_a_slurm_job"}
"""The other tests that take a Slurm turn (tests/test_suite_layout.py keeps this list whole)."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The real-Slurm tests of each private Slurm instance go to one worker, one test after
    another; the rest spread over the workers. A turn taken on two workers left one of them
    idle on the lock while the other ran; two instances give two such chains at once
    (xdist's own ``--dist loadgroup`` marks groups by rewriting node ids, which pytest 9
    ignores; this scheduler reads the file of each id instead)."""
    from xdist.scheduler import LoadScopeScheduling

    class SlurmChains(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            if path in SLURM_FILES or nodeid.split("[")[0] in SLURM_TESTS:
                return "slurm " + slurm_env.conf_of(path)
            return nodeid

    return SlurmChains(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The test's private Slurm is chosen before any of its fixtures (a module's gateway
    among them) asks slurm_conf() which it is."""
    slurm_env.use(slurm_env.conf_of(item.nodeid.split("::")[0]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the end of each gateway log in its tmp_path (a 500
    says only "it is logged": the log is gone once pytest's old tmp dirs rotate out)."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not rep.failed or not isinstance(tmp, Path):
        return
    for log in sorted(tmp.glob("**/gateway-*.log")):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        starts = [i for i, line in enumerate(lines) if "Traceback" in line or " ERROR " in line]
        shown = lines[max(0, starts[0] - 5):][:150] if starts else lines[-40:]
        rep.sections.append((f"gateway log {log.name}", "\n".join(shown)))
    # ... and why each of its local jobs that did not complete ended so (the reason an
    # assertion on a job's state cuts off), with its supervisor's log.
    for result in sorted(tmp.glob("**/jobs/*/result.json"))[:20]:
        try:
            ended = json.loads(result.read_text())
            if ended.get("state") == "COMPLETED":
                continue
            log_text = (result.parent / "runner.log").read_text(errors="replace")[-2000:] \
                if (result.parent / "runner.log").exists() else ""
        except (OSError, ValueError):
            continue
        rep.sections.append((f"local job {result.parent.name}", json.dumps(ended) + "\n" + log_text))


@contextlib.contextmanager
def temporary_user(prefix: str, kill: bool = False) -> Iterator[pwd.struct_passwd]:
    """A Unix user without a home, named for this process (one an interrupted run left is
    removed first), removed afterwards; ``kill``: its processes killed before."""
    name = f"{prefix}{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        if kill:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
