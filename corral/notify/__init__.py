"""Notifications to the people who answer for agents (issue 51): a sponsor is told when
their agents' jobs end (all, failures only, or none), when a budget crosses 50, 80 and
100%, and when the policy refuses an agent or taints its token; by email (SMTP) or a
webhook (generic JSON, ntfy, Slack/Mattermost), with quiet hours and a digest.

    prefs.py     what a person chose, over the site's defaults ([notify] in corral.toml)
    compose.py   the words of each notification, secrets redacted
    channels.py  delivery: SMTP, webhooks
    notifier.py  the facility loop: job events and decisions -> the outbox -> delivery

Every notification is a row of the outbox (corral/core/store/notify.py) before it is
sent, so a restart loses none and an event read twice is told once; delivery runs off
the request path, each try bounded by a timeout, failures retried with backoff.
"""
