"""The run inspector: a web app over the run log (`sa ui`) and a run as one HTML file (`sa replay --html`).

- `views`   what the pages show, as plain data: event views, the runs-index digests and filters, fork trees
- `app`     `create_app`: the Starlette app (pages, JSON API, live following over server-sent events, fork)
- `export`  `render_html`: a run's page as one self-contained file, no network needed to open it
- `static/` the pages themselves: plain HTML, CSS and JavaScript, no build step, no CDN

Everything is read through `runtime.log.RunLog`; the inspector adds nothing to a run's hot path.
"""

from runtime.ui.export import render_html
from runtime.ui.views import RunFilter, run_view

__all__ = ["RunFilter", "create_app", "render_html", "run_view"]


def __getattr__(name: str) -> object:
    # the app pulls in starlette and nats-py; `sa replay --html` needs only the export
    if name == "create_app":
        from runtime.ui.app import create_app

        return create_app
    raise AttributeError(name)
