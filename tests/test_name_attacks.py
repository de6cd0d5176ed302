"""Names and addresses attacked (issue 47 item 6, reserved names on every edge; issue 51's
notification choices): what only looks like a valid one must be refused."""

from __future__ import annotations

from pathlib import Path

from .conftest import Gateway, add_people, running


def test_a_trailing_newline_does_not_pass_the_name_check(gateway: Gateway) -> None:
    """``re.match`` with ``$`` accepts a name followed by one newline: 'fastlane\\n' passed
    the check and the reserved list (an exact comparison), and printed as corral's own
    service principal (and 'alice\\n' as a person) in every listing, log and audit line."""
    people = add_people(gateway)
    with gateway.http() as admin, gateway.http(people["alice"]) as alice:
        for who, body in ((admin, {"name": "fastlane\n", "kind": "service"}),
                          (alice, {"name": "fastlane\n", "kind": "agent"}),
                          (alice, {"name": "carol\n", "kind": "agent"})):
            r = who.post("/v1/principals", json=body)
            assert r.status_code == 400, (body, r.status_code, r.text)
        names = [p["name"] for p in admin.get("/v1/principals").json()]
        assert not [n for n in names if n != n.strip()], names


def test_a_notification_address_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """The same '$' in the email check: 'alice@cluster.example\\n' was taken (200) and every
    message to it went to a garbled To: (a@b.=?utf-8?q?c=0A?=), so the sponsor was told
    nothing while corral said the address was set; '22-07\\n' passed as quiet hours."""
    with running(tmp_path, CORRAL_NOTIFY__SMTP_HOST="127.0.0.1") as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"email": "alice@cluster.example"}).status_code == 200
            for body in ({"email": "alice@cluster.example\n"}, {"quiet_hours": "22-07\n"}):
                r = a.put("/v1/notify", json=body)
                assert r.status_code == 400, (body, r.text)


def test_an_image_name_that_reads_as_a_key_is_refused(gateway: Gateway) -> None:
    """A job naming image 'deadbeef' runs the caller's own image of that name, else the
    image whose key starts so: a name that reads as a key prefix would let another
    principal's image (its key chosen to match) run where the caller meant its own while
    that one was unbuilt or building. No name may read as a key."""
    people = add_people(gateway)
    with gateway.http(people["bot1"]) as b:
        for name in ("deadbeef", "0123456789abcdef"):
            r = b.post("/v1/env/build", json={"files": {"requirements.txt": "six\n"}, "name": name})
            assert r.status_code == 400 and "reads as an image key" in r.text, (name, r.text)
