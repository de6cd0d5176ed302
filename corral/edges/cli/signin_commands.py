"""``corral login`` and ``corral dashboard``: a person signs in as HPC signs them in
(munge on a login node, or the gateway's sign-in socket on its machine; decision 0060),
and opens the dashboard through a one-time link."""

from __future__ import annotations

import time
from typing import Any

import click

from corral.edges import acts


@click.command()
@click.option("--via", type=click.Choice(["munge", "socket"]), default="munge", show_default=True,
              help="munge: a credential from this machine's munged (any login node). socket: the gateway's "
                   "sign-in socket, on the gateway's own machine.")
@click.option("--socket", "socket_path", help="The sign-in socket (default $CORRAL_SIGNIN_SOCKET, else "
                                              "/run/corral/signin.sock).")
@click.option("--print", "print_token", is_flag=True, help="Print the token alone (export CORRAL_TOKEN=$(...)).")
@click.pass_obj
def login(o: Any, via: str, socket_path: str | None, print_token: bool) -> None:
    """Sign in as yourself, without an admin: your Unix user proves who you are.

    \b
    The gateway maps your uid to the person whose Unix user it is and gives you a
    short-lived token, kept for your next commands (~/.local/state/corral/signin/,
    0600). A command run without a token signs you in by munge by itself; this
    command does it now, or by the socket. Then, as yourself:
      corral token mint --for YOUR-AGENT --expires 8h     # within the site's limits
      corral token revoke ID
      corral dashboard                                    # a one-time link
    """
    from corral.edges.signin_client import sign_in

    t = sign_in(o.url, via, socket_path)
    if print_token:
        click.echo(t["token"])
        return
    o.out({k: v for k, v in t.items() if k != "token"},
          lambda t: f"signed in as {t['principal']} by {t['via']} until "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t['expires']))} (token {t['id']})")


@click.command()
@click.pass_obj
def dashboard(o: Any) -> None:
    """Print a one-time link that signs your browser in to the dashboard as you.

    It works once, for a short while (the site's [signin] link_s); opening it asks
    you to confirm whom you sign in as. Admins may still paste a token on the
    dashboard's sign-in form.

    \b
    Example (on a login node, signed in by munge):
      corral dashboard        # then open the link it prints, once
    """
    link = o.client.run(acts.signin_link)
    url = o.url.rstrip("/") + link["path"]
    o.out({**link, "url": url}, lambda _: f"{url}\n(signs in {link['principal']} once, until "
                                          f"{time.strftime('%H:%M:%S', time.localtime(link['expires']))})")
