"""`check_bundle`: everything a host checks of a bundle before it serves it, offline (`sa check BUNDLE`).

`load_bundle` checks the file, each section and every tool; a host then builds, from the loaded bundle, the
kernel's config (`KernelConfig` refuses some combinations on its own) and the model step with its decoding
constraint (an `ebnf` grammar is derived by xgrammar, which refuses tool schemas it cannot express). This
does the same, with no model server and no NATS, so a bundle that `sa check` passes is one a host starts
with. What only a running fleet can tell (a model server that answers, a schedule's store) is not checked.
"""

from __future__ import annotations

from pathlib import Path

from runtime.bundle.load import load_bundle
from runtime.bundle.problems import BundleError
from runtime.bundle.resolved import Bundle

__all__ = ["check_bundle"]


def check_bundle(path: str | Path) -> tuple[Bundle, list[str]]:
    """The bundle at `path` (a bundle.yaml or its folder) as a host would build it, and warnings about what
    this machine could not check (the `ebnf` grammar without the `model` extra); `BundleError` naming the
    file, the YAML path and the fix for every problem."""
    from runtime.extras import missing
    from runtime.model import ConstraintError, ModelStep, get_adapter

    bundle = load_bundle(path)
    source = str(bundle.path)
    try:
        config = bundle.kernel_config()
    except ValueError as e:
        raise BundleError(source, [("", f"the kernel refuses this configuration: {e}")]) from None
    constraint = bundle.decoding_constraint()
    if constraint is not None and constraint.strategy == "ebnf" and missing("model"):
        return bundle, [f"{source}: constraint: the ebnf grammar was not derived: it needs the 'model' extra "
                        "(xgrammar), as a host serving this bundle does"]
    try:
        server = bundle.spec.model.server  # `auto` is asked at start; vLLM's fields take every strategy
        ModelStep.for_config(get_adapter(bundle.spec.model.adapter), config, constraint,
                             dialect="vllm" if server == "auto" else server)
    except ConstraintError as e:
        raise BundleError(source, [("constraint", f"the decoding constraint cannot be built: {e}")]) from None
    return bundle, []
