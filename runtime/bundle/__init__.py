"""bundle.yaml: one agent's whole configuration, validated up front with errors that name the YAML path.

    bundle = load_bundle("bundles/demo")      # a bundle.yaml, or the folder holding one
    bundle.tools, bundle.kernel_config()      # or BundleError: every problem, `<file>: <yaml path>: <fix>`

`schema` (the keys a bundle may have, with an annotated bundle.yaml), `sections` (one function per
top-level section: what its values mean, and its own problems), `capacity` (the sections that share the
model: `endpoint:`, `budgets:`, `priority:`), `tools` (the `tools:` section: scripts,
Python functions and other agents as configured tools), `values` (limits and output models, which several
sections hold), `problems` (`BundleError`, pydantic errors as YAML paths), `resolved` (the `Bundle`),
`load` (`load_bundle`: read, check every section, resolve), `check` (`check_bundle`: what a host builds
from it at start, offline: `sa check`).
"""

from runtime.bundle.check import check_bundle
from runtime.bundle.load import load_bundle
from runtime.bundle.problems import BundleError
from runtime.bundle.resolved import Bundle, BundleTool, DataProviderSpec
from runtime.bundle.schema import BundleSpec
from runtime.bundle.sections import SAMPLING_KEYS

# the sampling keys' name before runtime.bundle was a package (the vLLM conformance test imports it)
_SAMPLING_KEYS = SAMPLING_KEYS

__all__ = ["SAMPLING_KEYS", "Bundle", "BundleError", "BundleSpec", "BundleTool", "DataProviderSpec",
           "check_bundle", "load_bundle"]
