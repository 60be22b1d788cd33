"""Test doubles shipped with the runtime (other packages' tests and benches use them too)."""

from runtime.testing.capacity import Capacity
from runtime.testing.scripted_model import Reply, Responder, ScriptedModelServer, last_message

__all__ = ["Capacity", "Reply", "Responder", "ScriptedModelServer", "last_message"]
