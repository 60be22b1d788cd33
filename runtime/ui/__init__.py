"""The run inspector: a web app over the fleet (`sa ui`) and a run as one HTML file (`sa replay --html`).

- `views`    what the pages show, as plain data: event views, run flags, the runs-index digests and
             filters, fork trees (pure: events in, dicts out)
- `reads`    what the pages read, through `runtime.client` (`Client`, `RunHandle`) and nothing else: the
             runs index, a run, one event whole, its thread, pending approvals, the export, and the
             team's pages below
- `waterfall` a run's time: the trace export's spans (`observe.traces.trace_of`) on one axis, open spans,
             approval waits, where the time went (pure)
- `conversation` what the model saw at a turn: the kernel's fold with each message's origin, the history
             window's cut, a thread's earlier runs, big payloads fetched on demand
- `pending`  everything waiting (approvals, tool jobs in flight, unfinished runs) and what is stuck, why
- `fleet`    hosts, workers, queues, partitions, dead letters (`sa status`, `sa dlq`)
- `agent`    an agent's bundle, the hosts serving it, its runs and failure kinds over time
- `bundles`  bundles loaded from the path the runs index names, when this machine can read them
- `actions`  what a page may change, through `RunHandle`: fork, cancel, approve, deny; and through
             `Client`: replay a dead letter
- `follow`   live following: a run's events and tokens as server-sent events until it ends
- `guard`    the door: the Host names it answers to, the origins it takes commands from, the CSP
- `routes`   the HTTP routes: a request in, a call of the above, JSON out
- `app`      `create_app`: the parts put together over one client
- `export`   `render_html`: a run's page as one self-contained file, no network needed to open it
- `static/`  the pages themselves: plain HTML, CSS and JavaScript, no build step, no CDN

The inspector adds nothing to a run's hot path: it reads the log through the client, as `sa` does.
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
