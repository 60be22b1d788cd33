"""`sa auth`: the NATS users and permissions of structured-agents, as configuration files.

    sa auth config           the nats-server `authorization` block (deploy/nats/auth.conf)
    sa auth config --helm    the same for the NATS Helm chart's `config.merge` (deploy/k8s/nats-values.yaml)

Both are generated from the role table in `runtime.nats.auth`, with each role's password read by the
server from its environment (`SA_<ROLE>_PASSWORD`), so the shipped files never hold a secret and a change
of a role's permissions is one change in code (`tests/nats/test_auth.py` checks the shipped files are
current).
"""

from __future__ import annotations

from typing import Annotated

import typer

from runtime.cli.app import PLAIN, app

auth_app = typer.Typer(help="NATS users and permissions per role (see the README, \"Who may do what\").",
                       no_args_is_help=True, **PLAIN)
app.add_typer(auth_app, name="auth")


@auth_app.command("config")
def config(helm: Annotated[bool, typer.Option("--helm", help="YAML for the NATS Helm chart's config.merge "
                                                           "instead of a nats-server config block.")] = False,
           ) -> None:
    """Print the authorization config for every role, passwords from $SA_<ROLE>_PASSWORD."""
    from runtime.nats.auth import default_users, helm_authorization, server_config

    users = default_users(env=True)
    if helm:
        import yaml

        typer.echo(yaml.safe_dump({"authorization": helm_authorization(users)}, sort_keys=False, width=110),
                   nl=False)
    else:
        typer.echo(server_config(users), nl=False)
