"""``corral config``: the configuration reference (docs/config.md), written from the
settings' declarations, and a check of a corral.toml that starts nothing. Neither needs
a gateway."""

from __future__ import annotations

from pathlib import Path

import click

from corral.edges.cli.kit import Ctx, fail


@click.group()
def config() -> None:
    """The configuration: every key's reference, and a check of a corral.toml.

    \b
    Examples:
      corral config reference > docs/config.md      # every key: type, default, meaning, example
      corral config check --home /var/lib/corral    # is its corral.toml valid? (exit 2 if not)
    """


@config.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write it to this file instead of stdout.")
def reference(out: Path | None) -> None:
    """Print the configuration reference (Markdown) from the settings' own declarations.

    \b
    Example:
      corral config reference --out docs/config.md
    """
    from corral.core.config_reference import render

    text = render()
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)


@config.command()
@click.option("--home", type=click.Path(path_type=Path), help="The gateway's state directory (its corral.toml; env CORRAL_HOME).")
@click.pass_obj
def check(o: Ctx, home: Path | None) -> None:
    """Check the settings a gateway would start with (file, environment), starting nothing.

    \b
    Examples:
      corral config check
      CORRAL_CONFIG=/etc/corral/corral.toml corral --json config check
    """
    from corral.core.config import config_file, load_settings
    from corral.core.errors import InvalidRequest

    try:
        settings = load_settings(home=home)
    except InvalidRequest as e:
        fail(e.message, 2, e.hint)
    path = config_file(settings.home)
    o.out({"file": str(path), "exists": path.is_file(), "home": str(settings.home), "url": settings.base_url},
          lambda d: f"{d['file']}: {'valid' if d['exists'] else 'absent (defaults, environment)'}; "
                    f"the gateway would serve {d['url']} with state in {d['home']}")
