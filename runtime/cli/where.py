"""Where things are, for every `sa` command that talks to NATS or loads bundles.

The NATS server: `--nats`, else `NATS_URL`, else the state file a running `sa up` writes (`runtime.running`,
the one function `Client.connect()` uses too: it holds the NATS URL, the local model URL, the bundles and the
pid, and is removed when `sa up` stops; a file whose `sa up` was killed is ignored, with a note). A command
that found NATS through the state file says which `sa up` it talks to, in one line on stderr (stdout stays
the command's own, for pipes).

Bundles: a bundle.yaml file, a folder holding one, or a folder of such folders (`sa up bundles`); with no
argument, `bundles/demo` of the current directory.
"""

from __future__ import annotations

from pathlib import Path

import typer

from runtime.running import find_nats

BUNDLE_FILE = "bundle.yaml"
DEFAULT_BUNDLE = Path("bundles/demo")


def resolve_nats(explicit: str | None, command: str) -> str:
    """`--nats`/NATS_URL, else the running `sa up` (named on stderr); exit 2 with what to do if there is
    neither."""
    def note(message: str) -> None:
        typer.echo(f"sa {command}: {message}", err=True)

    url = find_nats(explicit, note=note)
    if not url:
        typer.echo(f"sa {command}: no NATS server: start one with `sa up`, or set NATS_URL "
                   "(or pass --nats nats://host:4222)", err=True)
        raise typer.Exit(2)
    return url


def bundle_paths(bundles: list[Path]) -> list[Path]:
    """The bundles `sa up` / `sa host` serve (see `expand_bundles`); `bundles/demo` when none is given."""
    if bundles:
        return expand_bundles(bundles)
    if (DEFAULT_BUNDLE / BUNDLE_FILE).is_file():
        return [DEFAULT_BUNDLE]
    typer.echo("no bundle given (and no bundles/demo here): pass bundle.yaml files or folders", err=True)
    raise typer.Exit(2)


def expand_bundles(paths: list[Path]) -> list[Path]:
    """Each path as given, except a folder without a bundle.yaml of its own: it stands for every subfolder
    that has one (sorted by name). Exit 2 naming the folder if it holds no bundle at all.

    A path that does not exist is kept, so loading it reports "cannot read the bundle" with its name."""
    out: list[Path] = []
    for path in paths:
        if not path.is_dir() or (path / BUNDLE_FILE).is_file():
            out.append(path)
            continue
        found = sorted(sub for sub in path.iterdir() if (sub / BUNDLE_FILE).is_file())
        if not found:
            typer.echo(f"error: {path} is a folder with no {BUNDLE_FILE}, and none of its subfolders has "
                       f"one: pass a bundle folder, a {BUNDLE_FILE} file, or a folder of bundle folders",
                       err=True)
            raise typer.Exit(2)
        out.extend(found)
    return out


__all__ = ["bundle_paths", "expand_bundles", "resolve_nats"]
