"""A run's page as one self-contained HTML file (`sa replay RUN --html > run.html`, the page's Export).

The file is the inspector's own run page (`static/run.html`) with its stylesheet, its scripts and the run's
view (`views.run_view`, events resolved whole) inlined, so it looks the same as the live page and can be
mailed, attached to a bug or archived, then opened anywhere with no server and no network.

Why it is safe to open:

* The data sits in a `<script type="application/json">` block that the browser never runs; the page's own
  script parses it and builds the DOM with `textContent`. In the JSON every `/`, `<`, `>` and `&` is
  escaped (`\\/`, `\\u003c`, ...), so no text from a run can close the block, and the file holds no URL at
  all (not even `https://` inside a model's reply).
* A Content-Security-Policy in the file allows no network access of any kind and runs only the one inline
  script whose hash it names (and the one inline style): a script smuggled into the page by some future
  rendering bug would still not run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for the types: `sa replay --html` imports this module without nats-py's weight
    from nats.js import JetStreamContext

    from runtime.client import Client

STATIC = Path(__file__).parent / "static"
_STYLE_TAG = '<link rel="stylesheet" href="/static/style.css">'
_SCRIPTS = ("common.js", "run-control.js", "run.js")  # the run page's scripts, in the order it loads them
_SCRIPT_TAGS = tuple(f'<script src="/static/{name}"></script>' for name in _SCRIPTS)


class ExportError(RuntimeError):
    """The shipped page no longer has the shape the export inlines (a packaging bug, not a user error)."""


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def embed_json(value: Any) -> str:
    """`value` as JSON that is inert inside an HTML `<script>` block and contains no URL-like `://`."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (("/", "\\/"), ("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text


class NoSuchRun(LookupError):
    """The run has no events (the message says where to find run ids)."""


async def export_run(source: Client | JetStreamContext, run_id: str) -> str:
    """The one-file HTML of a run read through the fleet client (`source`: a `runtime.client.Client`, or a
    JetStream context, wrapped in one): its events whole (big payloads fetched), its index entry and fork
    tree. `NoSuchRun` if it has no events."""
    from runtime.client import Client
    from runtime.nats.subjects import check_token
    from runtime.ui.views import run_view

    check_token(run_id, "run id")
    client = Client.over(source)
    history = await client.get(run_id).history()
    if not history.events:
        raise NoSuchRun(f"no events for run {run_id!r} (see `sa runs`)")
    index = await client.index()
    view = run_view(run_id, history.actor, history.events, entry=index.get(run_id), index=index,
                    exported=True)
    return render_html({**view, "exported_at": time.time()})


def render_html(view: dict[str, Any]) -> str:
    """The whole HTML document for a run's view (make it with `exported=True` and resolved events)."""
    page = (STATIC / "run.html").read_text()
    css = (STATIC / "style.css").read_text()
    script = "\n".join((STATIC / name).read_text() for name in _SCRIPTS)
    if "</script" in script.lower() or "</style" in css.lower():
        raise ExportError("the inspector's script or style contains a closing tag and cannot be inlined")
    missing = [tag for tag in (_STYLE_TAG, *_SCRIPT_TAGS, "<head>") if page.count(tag) != 1]
    if missing:
        raise ExportError(f"static/run.html lacks {', '.join(missing)}: the export cannot inline it")
    csp = (f"default-src 'none'; script-src '{_hash(script)}'; style-src '{_hash(css)}'; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    page = page.replace("<head>", f'<head>\n<meta http-equiv="Content-Security-Policy" content="{csp}">', 1)
    page = page.replace(_STYLE_TAG, f"<style>{css}</style>", 1)
    for tag in _SCRIPT_TAGS[1:]:
        page = page.replace(tag + "\n", "", 1).replace(tag, "", 1)
    data = f'<script type="application/json" id="run-data">{embed_json(view)}</script>'
    return page.replace(_SCRIPT_TAGS[0], f"{data}\n<script>{script}</script>", 1)


__all__ = ["ExportError", "NoSuchRun", "embed_json", "export_run", "render_html"]
