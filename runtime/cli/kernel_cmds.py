"""Commands registered on the `sa` app (see runtime/cli/__init__.py)."""

from runtime.cli.app import app  # noqa: F401
