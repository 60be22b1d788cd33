"""structured-agents: an event-sourced actor runtime for many concurrent LLM agents on NATS.

Import what you need from the submodules; this package keeps its top level free of heavy imports so
that `sa run` does not pay for torch or nats when it only needs the sandbox.
"""

__version__ = "0.1.0"
