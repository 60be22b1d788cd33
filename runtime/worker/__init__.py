"""The tool worker (`sa worker`): see `runtime.worker.loop` (moved here unchanged, to be split next)."""

from runtime.worker.loop import ToolRegistry, Worker, WorkerStats, build_registry, serve

__all__ = ["ToolRegistry", "Worker", "WorkerStats", "build_registry", "serve"]
