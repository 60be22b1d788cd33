"""Approval rules (pure): the declarative condition, the bundle's `approval:` entries, and the kernel's
decisions about them: which calls wait, the timeout verdict decided from event timestamps, edited
arguments dispatched as approved, and `sa replay --verify` accepting a timeout verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_sim import Reply, Sim, schema, script

from runtime import events as ev
from runtime import kernel as k
from runtime.approval_policy import ApprovalRule, Clause, Condition, ConditionError, parse_condition, rule_for
from runtime.bundle import BundleError, load_bundle
from runtime.client.verify import verify
from runtime.types import ToolCall

TRANSFER = schema("transfer", amount="number", to="string")
TOOLS = (TRANSFER, schema("search", q="string"), schema("submit_result", answer="string"))


def transfer(amount: object, to: str = "acme") -> ToolCall:
    return ToolCall("r/1.0", "transfer", {"amount": amount, "to": to})


# ── the condition ─────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("op", "value", "arg", "holds"), [
    (">", 100, 150, True), (">", 100, 100, False), (">=", 100, 100, True), ("<", 10, 3, True),
    ("==", "prod", "prod", True), ("!=", "prod", "dev", True), ("in", ["a", "b"], "b", True),
    ("not_in", ["a", "b"], "b", False), ("contains", "prod", "eu-prod-1", True),
    ("contains", "x", ["x", "y"], True), ("matches", r"^\d{4}$", "2024", True),
    ("matches", r"^\d+$", "v1", False),
])
def test_a_clause_compares_an_argument_with_a_value(op, value, arg, holds):
    assert Clause("a", op, value).holds({"a": arg}) is holds


def test_a_clause_fails_closed_on_values_it_cannot_compare_and_is_false_on_absent_arguments():
    over = Clause("amount", ">", 100)
    assert over.holds({"amount": "lots"})  # cannot judge: the call waits for a person
    assert over.holds({"amount": True})  # a bool is not a number here either
    assert not over.holds({})  # no amount at all: this is not the call the rule names
    assert Clause("amount", "absent").holds({}) and Clause("amount", "present").holds({"amount": 1})
    assert Clause("target.env", "==", "prod").holds({"target": {"env": "prod"}})
    assert not Clause("target.env", "==", "prod").holds({"target": "prod"})


def test_all_and_any_combine_clauses():
    cond = parse_condition({"all": [{"arg": "amount", "op": ">", "value": 100}],
                            "any": [{"arg": "to", "op": "==", "value": "acme"},
                                    {"arg": "to", "op": "matches", "value": "^ext-"}]})
    assert cond.holds({"amount": 500, "to": "ext-7"})
    assert not cond.holds({"amount": 500, "to": "bob"})
    assert not cond.holds({"amount": 50, "to": "acme"})
    assert cond.describe() == "amount > 100 and (to == 'acme' or to matches '^ext-')"
    one = Condition(all=(Clause("amount", ">", 1),))
    assert parse_condition({"arg": "amount", "op": ">", "value": 1}) == one


@pytest.mark.parametrize(("spec", "message"), [
    ({"arg": "a", "op": "≈", "value": 1}, "unknown op '≈'"),
    ({"arg": "a", "op": "in", "value": 3}, "needs a list"),
    ({"arg": "a", "op": ">"}, "needs a `value`"),
    ({"arg": "a", "op": "matches", "value": "("}, "not a regular expression"),
    ({"all": [{"arg": "a", "op": "==", "value": 1, "extra": 2}]}, "all[0]: unknown key(s) extra"),
    ({"every": []}, "unknown key(s) every"),
    ({}, "empty condition"),
    ("amount > 100", "a condition is a mapping"),
])
def test_a_malformed_condition_says_what_to_fix(spec, message):
    with pytest.raises(ConditionError, match=None) as info:
        parse_condition(spec)
    assert message in str(info.value)


def test_the_first_matching_rule_applies():
    rules = (ApprovalRule("transfer", when=Condition(all=(Clause("amount", ">", 100),)), role="finance"),
             ApprovalRule("deploy"))
    assert rule_for(rules, transfer(500)) is rules[0]
    assert rule_for(rules, transfer(5)) is None
    assert rule_for(rules, ToolCall("x", "deploy", {})) is rules[1]
    with pytest.raises(ConditionError, match="on_timeout"):
        ApprovalRule("t", on_timeout="maybe")  # type: ignore[arg-type]


# ── the kernel ────────────────────────────────────────────────────────────────────────────────────────


def config(*rules: ApprovalRule, **kw) -> k.KernelConfig:
    return k.KernelConfig(tools=TOOLS, terminal_tool="submit_result", approvals=rules, **kw)


OVER_100 = Condition(all=(Clause("amount", ">", 100),))


def test_only_calls_whose_condition_holds_wait_and_the_request_carries_what_an_operator_needs():
    sim = Sim(config(ApprovalRule("transfer", when=OVER_100, timeout_s=60, on_timeout="approve",
                                  role="finance"))).start()
    sim.step(script(Reply("", (("transfer", {"amount": 50}), ("transfer", {"amount": 500})))))
    decisions = k.decide(sim.state)
    assert isinstance(decisions[0], ev.ApprovalRequested) and isinstance(decisions[1], k.CallTools)
    request, tools = decisions
    assert request.call.arguments == {"amount": 500}
    assert [c.arguments for c in tools.calls] == [{"amount": 50}]
    assert (request.condition, request.role, request.timeout_s, request.on_timeout) == \
        ("amount > 100", "finance", 60, "approve")
    assert request.parameters == TRANSFER.parameters


def test_requires_approval_still_means_every_call_waits():
    sim = Sim(k.KernelConfig(tools=TOOLS, requires_approval=frozenset({"search"}))).start()
    sim.step(script(Reply("", (("search", {"q": "x"}),))))
    [request] = k.decide(sim.state)
    assert isinstance(request, ev.ApprovalRequested) and request.timeout_s is None and request.condition == ""


def _waiting(on_timeout: str = "deny") -> Sim:
    sim = Sim(config(ApprovalRule("transfer", timeout_s=30, on_timeout=on_timeout)), tick=1.0).start()
    sim.step(script(Reply("", (("transfer", {"amount": 500}),))))  # model.*, then approval.requested
    sim.step(script())
    assert [ev.kind_of(e) for e in sim.events][-1] == "approval.requested"
    return sim


def test_the_timeout_verdict_is_decided_from_timestamps_and_the_host_wakes_for_it():
    sim = _waiting()
    requested = sim.events[-1]
    assert k.decide(sim.state) == []  # nobody answered, no time has passed in the log
    assert k.next_timer(sim.state) == requested.ts + 30  # when the host must wake up
    assert k.expire(sim.state, requested.ts + 29.9) == []
    [verdict] = k.expire(sim.state, requested.ts + 30)
    assert isinstance(verdict, ev.ApprovalDenied) and verdict.by == "timeout"
    assert "no decision within 30 s" in verdict.reason
    sim.clock = requested.ts + 30  # the host woke at the timer: its clock stamps the verdict
    sim.append(verdict)
    assert k.next_timer(sim.state) is None  # decided: nothing left to wake for
    [failed] = k.decide(sim.state)
    assert isinstance(failed, ev.ToolFailed) and failed.error.kind == "policy"
    assert "denied by the approval policy" in failed.error.message
    assert verify(sim.config, sim.events).ok  # replay --verify accepts the timeout verdict


def test_an_event_past_the_timeout_makes_decide_return_the_verdict_too():
    sim = _waiting(on_timeout="approve")
    sim.clock += 100  # the next event (here: a cancel-free no-op outcome for an unknown call) is late
    sim.emit(ev.ToolCompleted, call_id="run1/9.9", tool="search")
    [verdict] = k.decide(sim.state)
    assert isinstance(verdict, ev.ApprovalGranted) and verdict.by == "timeout"
    sim.append(verdict)
    [run] = k.decide(sim.state)
    assert isinstance(run, k.CallTools) and run.calls[0].name == "transfer"


def test_a_timeout_verdict_the_log_holds_too_early_fails_verification():
    sim = _waiting()
    requested = sim.events[-1]
    sim.append(ev.ApprovalDenied(run_id="run1", call_id="run1/1.0", by="timeout", ts=requested.ts + 5,
                                 reason="no decision within 30 s: denied by the approval policy"))
    report = verify(sim.config, sim.events)
    assert not report.ok and "approval.denied" in report.problems[0]


def test_an_approver_s_edited_arguments_are_what_the_call_runs_with():
    sim = _waiting()
    sim.emit(ev.ApprovalGranted, call_id="run1/1.0", by="ops", arguments={"amount": 90, "to": "acme"})
    [run] = k.decide(sim.state)
    assert isinstance(run, k.CallTools) and run.calls == (ToolCall("run1/1.0", "transfer",
                                                                   {"amount": 90, "to": "acme"}),)
    assert k.pending_approvals(sim.state) == () and k.next_timer(sim.state) is None
    sim.step(script(Reply("", (("submit_result", {"answer": "sent"}),))))  # tool.called with the edit
    called = next(e for e in sim.events if isinstance(e, ev.ToolCalled))
    assert called.call.arguments == {"amount": 90, "to": "acme"}
    assert verify(sim.config, sim.events).ok


# ── the bundle ────────────────────────────────────────────────────────────────────────────────────────

PYM = '''"""Move money."""
from grail import Input

amount: float = Input("amount")
to: str = Input("to", default="acme")

{"sent": amount}
'''


def _bundle(tmp_path: Path, approval: str) -> Path:
    (tmp_path / "transfer.pym").write_text(PYM)
    path = tmp_path / "bundle.yaml"
    path.write_text("name: pay\ntools:\n  - path: transfer.pym\n" + approval)
    return path


def test_a_bundle_declares_an_approval_rule_per_tool(tmp_path):
    bundle = load_bundle(_bundle(tmp_path, "    approval:\n      when: {arg: amount, op: '>', value: 100}\n"
                                           "      timeout: 10m\n      on_timeout: approve\n"
                                           "      role: finance\n"))
    [rule] = bundle.kernel_config().approvals
    assert (rule.tool, rule.timeout_s, rule.on_timeout, rule.role) == \
        ("transfer", 600.0, "approve", "finance")
    assert rule.when is not None and rule.when.describe() == "amount > 100"


def test_a_bad_approval_entry_names_its_yaml_path(tmp_path):
    with pytest.raises(BundleError) as info:
        load_bundle(_bundle(tmp_path, "    approval:\n      when: {arg: amount, op: '=>', value: 1}\n"
                                      "      timeout: soon\n      on_timout: deny\n"))
    text = str(info.value)
    assert "tools[0].approval.on_timout: unknown key (did you mean 'on_timeout'?)" in text


def test_an_approval_request_recorded_before_approval_rules_still_verifies():
    """Logs written before requests recorded their rule hold the call alone: they must still verify, and a
    request for another call must not."""
    import msgspec

    sim = _waiting()
    requested = sim.events[-1]
    assert isinstance(requested, ev.ApprovalRequested) and requested.timeout_s is not None
    old = msgspec.structs.replace(requested, condition="", parameters={}, role="", timeout_s=None)
    assert verify(sim.config, [*sim.events[:-1], old]).ok
    other = msgspec.structs.replace(old, call=msgspec.structs.replace(old.call, id="run1/1.9"))
    assert not verify(sim.config, [*sim.events[:-1], other]).ok
