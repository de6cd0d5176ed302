"""People sign in as HPC signs them in (decision 0060), against the private cluster's
real munged: a person's `corral` on the login node proves who they are with a munge
credential (or the kernel's peer credentials on the sign-in socket), and mints and
revokes their own agents' tokens within the site's limits, without an admin. Each
attack on it (a replayed credential, one from another key, one for another gateway, an
old one, root's, an unknown user's, a huge body) is refused, and says why."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from . import slurm_env
from .conftest import Gateway, running, temporary_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="makes Unix users to sign in as: run as root")
REPO = Path(__file__).resolve().parent.parent


def cluster_munge() -> str:
    """The private cluster's munged socket, once it makes and checks a credential; under
    CI a missing munge fails the test (scripts/slurm-up starts it)."""
    from corral.gateway.signin import socket_in_slurm_conf

    sock = socket_in_slurm_conf(slurm_env.SLURM_CONF)
    ok = bool(shutil.which("munge") and sock)
    deadline = time.monotonic() + 60
    while ok:
        made = subprocess.run(["munge", "-n", "-S", str(sock)], capture_output=True, text=True)
        if made.returncode == 0 and subprocess.run(["unmunge", "-S", str(sock)], input=made.stdout,
                                                   capture_output=True, text=True).returncode == 0:
            break
        if time.monotonic() > deadline:
            ok = False
        time.sleep(0.5)
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail("munge is required under CI (the private cluster's munged); make test runs scripts/slurm-up")
        pytest.skip("no munged here: run scripts/slurm-up (as root)")
    return str(sock)


def credential(sock: str, payload: str | None, user: pwd.struct_passwd | None = None, ttl: int | None = None) -> str:
    """A credential from munged at ``sock`` made by ``user`` (root if None)."""
    argv = ["munge", "-S", sock] + (["-s", payload] if payload is not None else ["-n"]) \
        + (["-t", str(ttl)] if ttl else [])
    kw: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    cp = subprocess.run(argv, capture_output=True, text=True, check=True, **kw)
    return cp.stdout.strip()


def as_user(u: pwd.struct_passwd, home: Path, gw: Gateway, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``corral ARGS`` run by the Unix user ``u`` (its own process, its own uid), no token given."""
    full = {"PATH": os.environ["PATH"], "HOME": str(home), "CORRAL_URL": gw.url, "LANG": "C.UTF-8", **env}
    if os.environ.get("PYTHONPATH"):  # the checkout under test (a clean one run from elsewhere)
        full["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", *args], env=full, cwd=str(home),
                          capture_output=True, text=True, timeout=120, user=u.pw_uid, group=u.pw_gid,
                          extra_groups=[])


@contextlib.contextmanager
def user_home(u: pwd.struct_passwd) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="corral-person-"))
    os.chown(d, u.pw_uid, u.pw_gid)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def own_munged(tmp: Path, key: Path | None) -> Iterator[tuple[str, Any]]:
    """A munged of the test's own (root's), with ``key`` (a copy of the cluster's: the
    same realm) or a fresh one. -> (its socket, a function that restarts it)."""
    d = Path(tempfile.mkdtemp(prefix="m", dir="/tmp"))  # short: a socket path fits in 107 bytes
    d.chmod(0o755)
    (d / "key").write_bytes(key.read_bytes()) if key else subprocess.run(
        ["mungekey", "-c", "-k", str(d / "key")], check=True, capture_output=True)
    (d / "key").chmod(0o400)
    sock = str(d / "sock")
    pid = d / "pid"

    def start() -> None:
        subprocess.run(["munged", f"--key-file={d / 'key'}", f"--socket={sock}", f"--pid-file={pid}",
                        f"--log-file={d / 'log'}", f"--seed-file={d / 'seed'}", "--force"], check=True)
        deadline = time.monotonic() + 30
        while subprocess.run(["munge", "-n", "-S", sock], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, (d / "log").read_text()
            time.sleep(0.1)

    def stop() -> None:
        with contextlib.suppress(OSError, ValueError):
            n = int(pid.read_text())
            os.kill(n, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while Path(f"/proc/{n}").exists() and Path(f"/proc/{n}/stat").read_text().split()[2] != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.05)

    def restart() -> None:
        stop()
        start()

    start()
    try:
        yield sock, restart
    finally:
        stop()
        shutil.rmtree(d, ignore_errors=True)


def people(gw: Gateway, u: pwd.struct_passwd) -> None:
    """pat: a person whose Unix user is ``u``, sponsoring patbot; carol's agent carolbot."""
    with gw.http() as h:
        for body in ({"name": "pat", "kind": "human", "unix_user": u.pw_name}, {"name": "carol", "kind": "human"},
                     {"name": "patbot", "kind": "agent", "sponsor": "pat"},
                     {"name": "carolbot", "kind": "agent", "sponsor": "carol"}):
            assert h.post("/v1/principals", json=body).status_code == 201, body


def test_a_person_signs_in_by_munge_and_answers_for_their_own_agents_within_the_sites_limits(tmp_path: Path) -> None:
    sock = cluster_munge()
    actions = '["submit", "status", "cancel", "read_output"]'
    with temporary_user("corrsi") as u, user_home(u) as home, \
            running(tmp_path, CORRAL_SIGNIN__MUNGE_SOCKET=sock, CORRAL_SIGNIN__AGENT_TOKENS_MAX="2",
                    CORRAL_SIGNIN__AGENT_TOKEN_MAX_S="86400", CORRAL_SIGNIN__AGENT_ACTIONS=actions) as gw:
        people(gw, u)
        env = {"CORRAL_MUNGE_SOCKET": sock}
        # A command without a token signs the person in by munge, as squeue would.
        who = as_user(u, home, gw, "--json", "whoami", **env)
        assert who.returncode == 0, who.stderr
        assert json.loads(who.stdout)["name"] == "pat"
        got = as_user(u, home, gw, "login", **env)
        assert got.returncode == 0 and "signed in as pat by munge" in got.stdout, got.stderr
        kept = list((home / ".local/state/corral/signin").iterdir())
        assert len(kept) == 1 and kept[0].stat().st_mode & 0o777 == 0o600 and kept[0].stat().st_uid == u.pw_uid

        minted = as_user(u, home, gw, "--json", "token", "mint", "--for", "patbot", "--expires", "1h", **env)
        assert minted.returncode == 0, minted.stderr
        first = json.loads(minted.stdout)
        assert any("may only" in line or "operation" in line for line in first["caveats"])  # the site's actions
        with gw.http(first["token"]) as bot:
            assert bot.get("/v1/whoami").json()["name"] == "patbot"

        def refused(*args: str) -> dict[str, Any]:
            cp = as_user(u, home, gw, "--json", *args, **env)
            assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
            return dict(json.loads(cp.stdout)["error"])

        assert "at most 1d" in refused("token", "mint", "--for", "patbot", "--expires", "30d")["message"]
        assert "at most 1d" in refused("token", "mint", "--for", "pat", "--expires", "never")["message"]
        assert "not manage" in refused("token", "mint", "--for", "patbot", "--actions", "submit,manage")["message"]
        assert "no principal 'carolbot'" in refused("token", "mint", "--for", "carolbot")["message"]
        second = json.loads(as_user(u, home, gw, "--json", "token", "mint", "--for", "patbot", **env).stdout)
        full = refused("token", "mint", "--for", "patbot", "--expires", "2h")
        assert "holds 2 live tokens" in full["message"] and "revoke" in full["hint"]
        # Revoking one of their agent's tokens makes room; another person's agent's is not theirs.
        with gw.http() as admin:
            carols = admin.post("/v1/tokens", json={"for": "carolbot", "expires": "1h"}).json()
        assert "no token" in refused("token", "revoke", carols["id"])["message"]
        assert as_user(u, home, gw, "token", "revoke", first["id"], **env).returncode == 0
        with gw.http(first["token"]) as bot:
            assert bot.get("/v1/whoami").status_code == 401
        assert as_user(u, home, gw, "token", "mint", "--for", "patbot", **env).returncode == 0
        assert second["id"]


def post(gw: Gateway, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/signin/munge", json=body, timeout=60, **kw)


def test_attacks_on_munge_sign_in_are_refused(tmp_path: Path) -> None:
    cluster = cluster_munge()
    key = slurm_env.slurm_dir(slurm_env.SLURM_CONF) / "munge" / "munge.key"
    with temporary_user("corrsa") as u, temporary_user("corrsx") as stranger, \
            own_munged(tmp_path, key) as (same_realm, restart), own_munged(tmp_path, None) as (other_key, _), \
            running(tmp_path, CORRAL_SIGNIN__MUNGE_SOCKET=same_realm, CORRAL_SIGNIN__MAX_AGE_S="5") as gw:
        people(gw, u)
        payload = f"corral-signin/1 {gw.url}"

        # The person's own credential: signed in once, as pat.
        cred = credential(cluster, payload, u)
        ok = post(gw, {"credential": cred})
        assert ok.status_code == 201 and ok.json()["principal"] == "pat", ok.text
        # Replayed: refused, also after the gateway's munged forgot it (munge's replay cache
        # is its own: a restart, or another replica's munged, would take it again).
        assert post(gw, {"credential": cred}).status_code == 401
        restart()
        assert subprocess.run(["unmunge", "-S", same_realm], input=cred, capture_output=True,
                              text=True).returncode == 0, "munge alone would take it again"
        restart()  # (that check spent it with this munged: forgotten once more)
        again = post(gw, {"credential": cred})
        assert again.status_code == 401 and "used already" in again.json()["error"]["message"]

        # Another munge key (another realm): not valid.
        foreign = post(gw, {"credential": credential(other_key, payload, u)})
        assert foreign.status_code == 401 and "not valid" in foreign.json()["error"]["message"], foreign.text
        # Made for another gateway, or for something else (no payload).
        for other in ("corral-signin/1 http://127.0.0.1:1", None, f"corral-signin/1 {gw.url}/x"):
            r = post(gw, {"credential": credential(cluster, other, u)})
            assert r.status_code == 401 and "another gateway" in r.json()["error"]["message"], (other, r.text)
        # Root is no person; a user no principal has is refused naming the uid; the body
        # cannot name anyone (only the credential's uid counts).
        root = post(gw, {"credential": credential(cluster, payload)})
        assert root.status_code == 403 and "root" in root.json()["error"]["message"]
        nobody = post(gw, {"credential": credential(cluster, payload, stranger)})
        assert nobody.status_code == 403 and f"uid {stranger.pw_uid}" in nobody.json()["error"]["message"]
        claim = post(gw, {"credential": credential(cluster, payload, stranger), "principal": "pat"})
        assert claim.status_code == 400
        # Old: past max_age_s (5 s, and 5 s for clocks), though munge's TTL is 300 s.
        old = credential(cluster, payload, u)
        made = time.time()
        while time.time() < made + 11:
            time.sleep(0.2)
        late = post(gw, {"credential": old})
        assert late.status_code == 401 and "at most 5 s old" in late.json()["error"]["message"], late.text
        # Huge: refused before it is read (413), a large one before anything is parsed
        # (401: no token), a long credential before unmunge runs (400).
        big = httpx.post(f"{gw.url}/v1/signin/munge", content=b"x" * (3 * 1024 * 1024),
                         headers={"Content-Type": "application/json"}, timeout=60)
        assert big.status_code == 413
        assert post(gw, {"credential": "M" * 100_000}).status_code == 401
        long = post(gw, {"credential": "MUNGE:" + "A" * 5000})
        assert long.status_code == 400 and "4096" in long.text
        # Every refusal is in the audit, and pat got exactly one token by munge.
        records = [json.loads(line.partition(" ")[2]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
        signins = [r for r in records if r.get("action") == "signin"]
        assert [r["principal"] for r in signins if r["decision"] == "allow"] == ["pat"]
        assert {r["rule"] for r in signins if r["decision"] == "deny"} >= {
            "signin-replay", "signin-audience", "signin-root", "signin-no-person", "signin-age", "signin-munge"}


def peer_ask(path: str, user: pwd.struct_passwd | None, request: bytes = b'{"signin": "token"}\n') -> dict[str, Any]:
    """Connect to the sign-in socket as ``user`` (root if None), in a process of its own."""
    code = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.sendall(sys.stdin.buffer.read()); s.shutdown(socket.SHUT_WR); "
            "sys.stdout.buffer.write(s.makefile('rb').read())")
    kw: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    cp = subprocess.run(["/usr/bin/python3", "-I", "-c", code, path], input=request, capture_output=True,
                        timeout=60, **kw)
    assert cp.returncode == 0, cp.stderr
    return dict(json.loads(cp.stdout))


def test_a_person_on_the_gateways_machine_signs_in_by_peer_credentials(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o755)
    path = str(d / "signin.sock")
    try:
        with temporary_user("corrsp") as u, temporary_user("corrsq") as stranger, user_home(u) as home, \
                running(tmp_path, CORRAL_SIGNIN__SOCKET=path) as gw:
            people(gw, u)
            assert os.stat(path).st_mode & 0o777 == 0o666
            got = peer_ask(path, u)
            assert got["principal"] == "pat" and got["via"] == "socket", got
            with gw.http(got["token"]) as pat:
                assert pat.get("/v1/whoami").json()["name"] == "pat"
            # What the client claims is not read: only the kernel's uid.
            assert peer_ask(path, stranger)["error"]["code"] == "forbidden"
            assert "root" in peer_ask(path, None)["error"]["message"]
            assert peer_ask(path, u, b'{"signin": "token", "as": "carol"}\n')["error"]["code"] == "invalid_request"
            assert peer_ask(path, u, b"x" * 5000 + b"\n")["error"]["code"] == "invalid_request"
            # The CLI's way: corral login --via socket.
            cp = as_user(u, home, gw, "login", "--via", "socket", "--socket", path)
            assert cp.returncode == 0 and "signed in as pat by socket" in cp.stdout, cp.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_agent_session_cannot_sign_in_as_its_person(tmp_path: Path) -> None:
    """Inside `corral agent run` the agent runs as its person: no kept token is used, no
    munge sign-in is tried, and the CLI says so."""
    sock = cluster_munge()
    with temporary_user("corrsg") as u, user_home(u) as home, \
            running(tmp_path, CORRAL_SIGNIN__MUNGE_SOCKET=sock) as gw:
        people(gw, u)
        assert as_user(u, home, gw, "login", CORRAL_MUNGE_SOCKET=sock).returncode == 0
        inside = as_user(u, home, gw, "--json", "whoami", CORRAL_MUNGE_SOCKET=sock, CORRAL_AGENT="1")
        assert inside.returncode == 2 and "no token given" in inside.stdout, inside.stdout
        refused = as_user(u, home, gw, "login", CORRAL_MUNGE_SOCKET=sock, CORRAL_AGENT="1")
        assert refused.returncode == 2 and "agent does not sign in" in refused.stderr


def test_the_agent_fence_hides_what_signs_its_person_in(tmp_path: Path) -> None:
    """`corral agent run` by a signed-in person: inside, the agent (running as the person)
    sees no kept token, cannot reach the sign-in socket nor munge, and `corral login`
    fails; outside, all three still work."""
    if shutil.which("bwrap") is None and os.environ.get("CI") != "true":
        pytest.skip("no bubblewrap: run scripts/sandbox-up")
    sock = cluster_munge()
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o755)
    path = str(d / "signin.sock")
    try:
        with temporary_user("corrsf") as u, user_home(u) as home, \
                running(tmp_path, CORRAL_SIGNIN__MUNGE_SOCKET=sock, CORRAL_SIGNIN__SOCKET=path) as gw:
            people(gw, u)
            env = {"CORRAL_MUNGE_SOCKET": sock, "CORRAL_SIGNIN_SOCKET": path}
            assert as_user(u, home, gw, "login", **env).returncode == 0
            with gw.http() as admin:
                bot = admin.post("/v1/tokens", json={"for": "patbot", "expires": "1h"}).json()["token"]
            token_file = home / "bot.token"
            token_file.write_text(bot)
            os.chown(token_file, u.pw_uid, u.pw_gid)
            token_file.chmod(0o600)
            probe = ("import socket,sys; s=socket.socket(socket.AF_UNIX)\n"
                     "try:\n s.connect(sys.argv[1]); print('SOCKET=reached')\n"
                     "except OSError as e:\n print('SOCKET=refused', e.errno)\n")
            script = (f"echo KEPT=$(ls -A ~/.local/state/corral/signin | wc -l); "
                      f"/usr/bin/python3 -I -c \"$PROBE\" {path}; "
                      f"munge -n -S {sock} >/dev/null 2>&1; echo MUNGE=$?; "
                      f"corral login >/dev/null 2>&1; echo LOGIN=$?")
            corral_bin = str(Path(sys.executable).parent / "corral")
            inside = as_user(u, home, gw, "agent", "run", "--quiet", "--token-file", str(token_file), "--",
                             "sh", "-c", script, PROBE=probe, PATH=f"{Path(corral_bin).parent}:{os.environ['PATH']}",
                             **env)
            out = inside.stdout
            assert inside.returncode == 0, out + inside.stderr
            assert "KEPT=0" in out and "SOCKET=refused" in out and "MUNGE=0" not in out and "LOGIN=0" not in out, out
            # Outside the fence, the person's own: all still there.
            assert len(list((home / ".local/state/corral/signin").iterdir())) == 1
            assert peer_ask(path, u)["principal"] == "pat"
    finally:
        shutil.rmtree(d, ignore_errors=True)
