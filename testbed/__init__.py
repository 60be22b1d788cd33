"""This repository's own test rig, shared by `tests/` and `bench/` and kept out of the installed package
(pyproject's `[tool.setuptools.packages.find]` ships `runtime*` only; `tests/core/test_wheel.py` holds it so).

- `fleet`      real `sa` processes (`SaProcess`, `start_all`) and the step model that drives them
- `scripts`    tool scripts with real sandboxed work: a workspace write per step, a trivial `add`, a spinner
- `latency`    a user-space TCP proxy that adds network latency (what `netem` would do)
- `netns`      machines on one machine: network namespaces on a bridge, cut and healed (root and `ip`)
- `netbed`     a 3-node NATS cluster, hosts and workers, each on a machine of its own
- `netfaults`  faults under load on a bed: cut a host, a worker, a NATS node; each phase's anomalies
- `checker`    counts anomalies from the stores after a phase: runs lost, repeated steps, lost writes
- `llamacpp`   a live llama.cpp server on the shipped SmolLM2 weights, and a tally of its calls' validity

What users need to test their own bundles (the scripted model server and its reply helpers) is
`runtime.testing`, which ships with the package.
"""
