"""The `sa` Typer application object, shared by the command modules that register on it.

Help is rendered plainly (`rich_markup_mode=None`): click's own layout, one line per option with its
flags, value type and help, with no boxes; rich markup would render every flag as `--help <bool>`.
Command modules import heavy dependencies (torch, xgrammar, nats) inside their command functions so
that `sa run` on a script starts in a fraction of a second.
"""

import os
from typing import Annotated, Any

import typer

PLAIN: dict[str, Any] = {"rich_markup_mode": None, "add_completion": False}

app = typer.Typer(
    name="sa",
    help="structured-agents: run sandboxed .pym tools and event-sourced LLM agents on NATS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 110},  # lines up to 110 columns when the terminal is that wide
    **PLAIN,
)
model_app = typer.Typer(help="The embedded CPU model server (vLLM's request format).", no_args_is_help=True,
                        **PLAIN)
app.add_typer(model_app, name="model")


# Credentials: options of `sa` itself, so every command takes them (`main` also accepts them after the
# command name). They set the variables `runtime.nats.credentials` reads, for this process and the ones
# it starts, so there is one place that turns them into connect options.
AUTH_FLAGS = ("--creds", "--user", "--password", "--tls-ca", "--tls-cert", "--tls-key")


@app.callback()
def credentials(
    creds: Annotated[str | None, typer.Option(
        "--creds", envvar="NATS_CREDS",
        help="NATS credentials file (user JWT and seed, as nsc writes).")] = None,
    user: Annotated[str | None, typer.Option(
        "--user", envvar="NATS_USER", help="NATS user name (a config-file user: sa up --secure, "
                                           "deploy/nats/auth.conf).")] = None,
    password: Annotated[str | None, typer.Option(
        "--password", envvar="NATS_PASSWORD", help="Password of --user (prefer NATS_PASSWORD: a flag is "
                                                   "visible to other users of the machine).")] = None,
    tls_ca: Annotated[str | None, typer.Option(
        "--tls-ca", envvar="NATS_CA", help="CA certificate that signed the server's (PEM).")] = None,
    tls_cert: Annotated[str | None, typer.Option(
        "--tls-cert", envvar="NATS_CERT", help="Client certificate (PEM), with --tls-key.")] = None,
    tls_key: Annotated[str | None, typer.Option(
        "--tls-key", envvar="NATS_KEY", help="Client certificate key (PEM).")] = None,
) -> None:
    """structured-agents: run sandboxed .pym tools and event-sourced LLM agents on NATS."""
    for name, value in (("NATS_CREDS", creds), ("NATS_USER", user), ("NATS_PASSWORD", password),
                        ("NATS_CA", tls_ca), ("NATS_CERT", tls_cert), ("NATS_KEY", tls_key)):
        if value:
            os.environ[name] = value


def hoist_auth_flags(argv: list[str]) -> list[str]:
    """`sa send demo hi --user alice` as `sa --user alice send demo hi`: the credential flags belong to
    `sa` itself, but people type them after the command."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag = arg.split("=", 1)[0]
        if flag in AUTH_FLAGS and i > 0:
            if "=" in arg:
                front.append(arg)
            elif i + 1 < len(argv):
                front += [arg, argv[i + 1]]
                i += 1
            else:
                rest.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest
