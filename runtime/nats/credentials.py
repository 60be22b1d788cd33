"""Who a process is on NATS: credentials and TLS from the environment, and the identity they stand for.

Why a module: every `sa` command, host and worker authenticates the same way, and the operator name a
command is published under (`runtime.nats.subjects.command_subject`) must be the name the server checked.
The variables are the ones the official `nats` CLI reads, so one environment serves both:

==================  ===========================================================================
NATS_CREDS          a NATS credentials file (user JWT + nkey seed, as `nsc` writes) for servers in
                    operator (JWT) mode; the identity is the JWT's ``name``
NATS_USER           user name (config-file users, as `deploy/nats/auth.conf` and `sa up --secure`
NATS_PASSWORD       set them up); the identity is the user name
NATS_CA             CA certificate (PEM) that signed the server's certificate: verify the server
NATS_CERT/NATS_KEY  client certificate and key (PEM), for servers that verify clients
==================  ===========================================================================

The `sa` flags ``--creds --user --password --tls-ca --tls-cert --tls-key`` set the same variables
(`runtime.cli.app.credentials`), so a process and the processes it starts agree. An authenticated connection
gets its own inbox prefix (``_INBOX_<identity>``): the auth config lets each user subscribe only there, so
no client reads another's replies. Pure apart from reading the files named (no nats-py, no network).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.nats.subjects import ANONYMOUS, check_token

ENV_CREDS = "NATS_CREDS"
ENV_USER = "NATS_USER"
ENV_PASSWORD = "NATS_PASSWORD"
ENV_CA = "NATS_CA"
ENV_CERT = "NATS_CERT"
ENV_KEY = "NATS_KEY"
CREDENTIAL_ENV = (ENV_CREDS, ENV_USER, ENV_PASSWORD, ENV_CA, ENV_CERT, ENV_KEY)


class CredentialsError(ValueError):
    """Credentials that cannot be used as given (the message says which setting and how to fix it)."""


@dataclass(frozen=True)
class Credentials:
    """How to authenticate (any of creds file, user/password) and how to secure the link (TLS files)."""

    creds: str | None = None
    user: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            return e.get(name, "").strip() or None

        return cls(get(ENV_CREDS), get(ENV_USER), e.get(ENV_PASSWORD) or None, get(ENV_CA), get(ENV_CERT),
                   get(ENV_KEY))

    @property
    def authenticated(self) -> bool:
        return bool(self.creds or self.user)

    def identity(self) -> str:
        """The name this connection authenticates as: the user, the creds file's JWT name, or anonymous."""
        if self.user:
            return _token(self.user, ENV_USER)
        if self.creds:
            return _token(jwt_name(self.creds), f"the name in {ENV_CREDS}={self.creds}")
        return ANONYMOUS

    def connect_options(self) -> dict[str, Any]:
        """nats-py `connect` keyword arguments; raise CredentialsError naming a setting that is unusable."""
        opts: dict[str, Any] = {}
        if self.user:
            if self.password is None:
                raise CredentialsError(f"{ENV_USER}={self.user} is set without a password: set "
                                       f"{ENV_PASSWORD} (or pass --password)")
            opts.update(user=self.user, password=self.password)
        if self.creds:
            _readable(self.creds, ENV_CREDS, "--creds")
            opts["user_credentials"] = self.creds
        if self.authenticated:
            opts["inbox_prefix"] = f"_INBOX_{self.identity()}"
        tls = self.tls_context()
        if tls is not None:
            opts["tls"] = tls
        return opts

    def tls_context(self) -> ssl.SSLContext | None:
        """A client TLS context from the CA and client certificate files, or None when none is set."""
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise CredentialsError(f"a client certificate needs both {ENV_CERT} and {ENV_KEY} "
                                   "(--tls-cert and --tls-key)")
        if self.tls_ca:
            _readable(self.tls_ca, ENV_CA, "--tls-ca")
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert and self.tls_key:
            _readable(self.tls_cert, ENV_CERT, "--tls-cert")
            _readable(self.tls_key, ENV_KEY, "--tls-key")
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except ssl.SSLError as e:
                raise CredentialsError(f"{ENV_CERT}={self.tls_cert} / {ENV_KEY}={self.tls_key}: not a "
                                       f"certificate and its key ({e.reason or e})") from None
        return ctx

    def describe(self) -> str:
        """Who this is, for messages: `user 'alice'`, `the credentials in FILE`, or `no credentials`."""
        if self.user:
            return f"user {self.user!r}"
        if self.creds:
            return f"the credentials in {self.creds}"
        return "no credentials"


def identity(env: Mapping[str, str] | None = None) -> str:
    """The operator name this process publishes commands under (see `Credentials.identity`)."""
    return Credentials.from_env(env).identity()


def jwt_name(creds_file: str) -> str:
    """The ``name`` claim of the user JWT in a NATS credentials file (its ``sub``, the user's public key,
    when it has no name). The server verifies the JWT; this only reads which name it carries."""
    text = _readable(creds_file, ENV_CREDS, "--creds").read_text()
    lines = [ln.strip() for ln in text.splitlines()]
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("-----BEGIN NATS USER JWT"))
        token = lines[start + 1]
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        name = claims.get("name") or claims["sub"]
    except (StopIteration, IndexError, ValueError, KeyError, TypeError):
        raise CredentialsError(f"{ENV_CREDS}={creds_file}: not a NATS credentials file (it needs a "
                               "'-----BEGIN NATS USER JWT-----' section, as `nsc generate creds` "
                               "writes)") from None
    return str(name)


def _token(name: str, where: str) -> str:
    try:
        return check_token(name, "the user name")
    except ValueError as e:
        raise CredentialsError(f"{where}: {e} (it becomes a subject token)") from None


def _readable(path: str, env: str, flag: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise CredentialsError(f"{env}={path}: no such file (pass an existing file with {flag} or {env})")
    return p


__all__ = ["CREDENTIAL_ENV", "ENV_CA", "ENV_CERT", "ENV_CREDS", "ENV_KEY", "ENV_PASSWORD", "ENV_USER",
           "Credentials", "CredentialsError", "identity", "jwt_name"]
