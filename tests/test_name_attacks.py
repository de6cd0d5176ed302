"""Principal names attacked (issue 47 item 6, reserved names on every edge): a name that
only looks like one corral keeps for itself, or like a person's, must be refused."""

from __future__ import annotations

from .conftest import Gateway, add_people


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
