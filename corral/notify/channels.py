"""Delivery: one try, bounded by a timeout, raising ``Undelivered`` with why on failure.
A webhook follows no redirect (a person's URL could otherwise send the gateway elsewhere
than the hosts the site allows) and connects to the one address its host resolved to when
it was judged (corral/core/destinations.py: a name a wildcard allows may not lead to the
gateway's own loopback); SMTP runs in a thread (smtplib blocks)."""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import httpx

from corral.core.config import NotifySettings
from corral.core.destinations import Refused, pin


class Undelivered(Exception):
    pass


async def webhook(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes, timeout: float,
                  allow: list[str]) -> None:
    target = httpx.URL(url)
    try:
        address = await asyncio.to_thread(pin, target.host, target.port or (443 if target.scheme == "https" else 80),
                                          allow)
    except Refused as e:
        raise Undelivered(str(e)) from None
    # Host names the site, SNI and the certificate's check the name; the socket the address.
    headers = {**headers, "Host": target.netloc.decode("ascii")}
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    try:
        r = await client.post(target.copy_with(host=address), content=body, headers=headers, timeout=timeout,
                              follow_redirects=False, extensions=extensions)
    except httpx.HTTPError as e:
        raise Undelivered(f"{type(e).__name__}: {e}".strip()) from None
    if not 200 <= r.status_code < 300:
        raise Undelivered(f"HTTP {r.status_code} from the webhook")


async def email(site: NotifySettings, to: str, subject: str, body: str, key: str) -> None:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = site.smtp_from, to, subject
    msg["Date"] = formatdate(localtime=True)
    # The outbox key as the Message-ID: a retry after a lost answer is the same message.
    msg["Message-ID"] = make_msgid(idstring=key.replace(":", ".")[:60], domain="corral")
    msg["Corral-Notification-Id"] = key[:900]
    msg.set_content(body)
    await asyncio.to_thread(_smtp, site, msg)


def _smtp(site: NotifySettings, msg: EmailMessage) -> None:
    assert site.smtp_host
    try:
        with smtplib.SMTP(site.smtp_host, site.smtp_port, timeout=site.timeout_s) as s:
            if site.smtp_starttls:
                s.starttls(context=ssl.create_default_context())
            s.send_message(msg)
    except (OSError, smtplib.SMTPException) as e:
        raise Undelivered(f"SMTP {site.smtp_host}:{site.smtp_port}: {type(e).__name__}: {e}".strip()) from None
