"""Post-plan gating's pure rules, without a server: what fits a plan, and which edits narrow it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from countersign.approval.edits import EditRejected
from countersign.approval.plan import ApprovedPlan, PlanRoute, apply_plan_edits, describe, editable_fields, route_call
from countersign.contract import MAX_PLAN_FORM_FIELDS, Outcome, Plan
from countersign.tools import default_registry
from countersign.tools.policy import (
    PlanPolicy,
    PolicyError,
    PolicyVerdict,
    ToolPolicy,
    evaluate,
    policy_version,
)
from countersign.tools.policy_file import merge
from countersign.web.pages import _MAX_FORM_FIELDS


def refund_plan() -> Plan:
    return Plan.model_validate(
        {
            "steps": [
                {"tool": "lookup_order", "args": {"order_id": 7}},
                {
                    "tool": "issue_refund",
                    "one_of": {"order_id": [7, 8]},
                    "at_most": {"amount_usd": "200"},
                    "calls": 2,
                },
            ],
            "max_calls": 3,
        }
    )


def refund(order: int, amount: str) -> dict[str, Any]:
    return {"order_id": order, "amount_usd": amount, "reason": "damaged"}


def test_calls_inside_the_plan_are_counted_and_the_rest_say_how_they_deviate() -> None:
    plan = ApprovedPlan(verdict=Outcome.APPROVED, plan=refund_plan(), approval_id="r-a0")
    assert plan.check("issue_refund", refund(9, "10.00")) == "order_id 9 is not one of the plan's 7, 8"
    assert plan.check("issue_refund", refund(7, "200.01")) == "amount_usd 200.01 is above the plan's bound 200"
    assert plan.check("delete_customer", {"customer_id": "c_1"}) == "delete_customer is not in the plan"
    assert plan.admit("issue_refund", refund(7, "200.00")) is None
    assert plan.admit("issue_refund", refund(8, "150.00")) is None
    assert plan.check("issue_refund", refund(8, "1.00")) == "step 2 allows 2 calls, all used"
    assert plan.admit("lookup_order", {"order_id": 7}) is None
    assert plan.check("lookup_order", {"order_id": 7}) == "more calls than the plan allows (3 in total)"


def test_a_plan_that_was_not_approved_admits_nothing() -> None:
    plan = ApprovedPlan(verdict=Outcome.REJECTED, reason="no")
    assert plan.check("lookup_order", {"order_id": 7}) == "the plan was rejected, so no call is inside it"


def test_edits_may_drop_steps_and_lower_bounds_and_counts() -> None:
    frozen = refund_plan().model_dump(mode="json")
    edited, changed = apply_plan_edits(
        frozen, {"step.0.drop": "drop", "step.1.at_most.amount_usd": "150", "step.1.calls": "2", "max_calls": "3"}
    )
    assert changed == {"step.0.drop": True, "step.1.at_most.amount_usd": "150"}
    approved = Plan.model_validate(edited)
    assert [s.tool for s in approved.steps] == ["issue_refund"] and approved.steps[0].at_most["amount_usd"] == 150
    assert approved.total == 2, "the total follows the steps that are left"
    assert "amount_usd ≤ 150" in describe(approved)


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ({"step.1.at_most.amount_usd": "250"}, "may only be lowered"),
        ({"step.1.calls": "5"}, "may only be lowered"),
        ({"step.1.calls": "two"}, "must be a whole number"),
        ({"step.1.at_most.amount_usd": "NaN"}, "finite"),
        ({"max_calls": "4"}, "may only be lowered"),
        ({"step.0.args.order_id": "9"}, "cannot be edited"),
        ({"step.0.drop": "drop", "step.1.drop": "drop"}, "reject the plan instead"),
    ],
)
def test_an_edit_that_widens_or_is_not_understood_is_refused(edits: dict[str, str], message: str) -> None:
    with pytest.raises(EditRejected, match=message):
        apply_plan_edits(refund_plan().model_dump(mode="json"), edits)


def test_a_plan_table_in_the_policy_file_is_validated_like_the_rest_of_the_policy() -> None:
    default = ToolPolicy(gated=True, approvers=("finance@example.com",))
    merged = merge(default, {"plan": {"on_deviation": "refuse"}}, source="APPROVALS_POLICY_FILE p.toml")
    assert merged.plan == PlanPolicy(on_deviation="refuse")
    assert policy_version("issue_refund", merged) != policy_version("issue_refund", default)
    with pytest.raises(PolicyError, match=r"APPROVALS_POLICY_FILE p.toml: plan.on_deviation"):
        merge(default, {"plan": {"on_deviation": "sometimes"}}, source="APPROVALS_POLICY_FILE p.toml")


def refund_verdict(amount: str, confidence: float | None, policy: ToolPolicy | None = None) -> PolicyVerdict:
    tool = default_registry().get("issue_refund")
    assert tool is not None
    checked = policy or tool.policy.model_copy(update={"gate_below_confidence": 0.7})
    return evaluate("issue_refund", checked, refund(7, amount), confidence=confidence)


def test_a_call_inside_the_plan_stopped_by_a_checkpoint_needs_its_own_approval_and_is_not_counted() -> None:
    plan = ApprovedPlan(verdict=Outcome.APPROVED, plan=refund_plan(), approval_id="r-a0")
    low = refund_verdict("100.00", 0.3)
    route = route_call(plan, low, "issue_refund", refund(7, "100.00"))
    assert route.kind == "own"
    assert route.why == "needs its own approval: the model's confidence was 0.30 < 0.70"
    assert plan.used == [0, 0], "a call asked on its own is not counted against the plan"
    sure = refund_verdict("100.00", 0.9)
    assert route_call(plan, sure, "issue_refund", refund(7, "100.00")).kind == "inside"
    assert plan.used == [0, 1]


def test_a_plan_of_a_tool_gated_only_by_checkpoints_does_not_let_a_stopped_call_run_with_no_human() -> None:
    only_checkpoints = ToolPolicy(gated=False, approvers=("finance@example.com",), gate_below_confidence=0.7)
    plan = ApprovedPlan(verdict=Outcome.AUTONOMOUS, plan=refund_plan(), proposed=refund_plan())
    stopped = refund_verdict("100.00", None, only_checkpoints)
    assert stopped.gated and stopped.stopped_because
    route = route_call(plan, stopped, "issue_refund", refund(7, "100.00"))
    assert route.kind == "own" and "the model reported no confidence" in (route.why or "")
    assert plan.used == [0, 0]


def test_a_quorum_or_high_stakes_call_inside_a_plan_needs_its_own_approval() -> None:
    plan = ApprovedPlan(
        verdict=Outcome.APPROVED,
        plan=Plan.model_validate({"steps": [{"tool": "delete_customer", "args": {"customer_id": "c_1"}}]}),
    )
    delete = default_registry().get("delete_customer")
    assert delete is not None
    args = {"customer_id": "c_1", "reason": "duplicate"}
    verdict = evaluate("delete_customer", delete.policy, args)
    route = route_call(plan, verdict, "delete_customer", args)
    assert route == PlanRoute("own", "needs its own approval: 2 approvers; high stakes")
    assert plan.used == [0]
    big = ApprovedPlan(verdict=Outcome.APPROVED, plan=refund_plan().model_copy(deep=True))
    assert big.plan is not None
    big.plan.steps[1].at_most["amount_usd"] = Decimal("5000")
    high = route_call(big, refund_verdict("1500.00", 0.9), "issue_refund", refund(7, "1500.00"))
    assert high == PlanRoute("own", "needs its own approval: high stakes")


def test_a_plan_saved_as_json_and_reloaded_keeps_its_counts() -> None:
    plan = ApprovedPlan(verdict=Outcome.APPROVED, plan=refund_plan(), approval_id="r-a0")
    assert plan.admit("issue_refund", refund(7, "200.00")) is None
    assert plan.admit("issue_refund", refund(8, "150.00")) is None
    reloaded = ApprovedPlan.model_validate_json(plan.model_dump_json())
    assert reloaded.used == [0, 2]
    assert reloaded.check("issue_refund", refund(8, "1.00")) == "step 2 allows 2 calls, all used"
    assert reloaded.admit("lookup_order", {"order_id": 7}) is None
    again = ApprovedPlan.model_validate_json(reloaded.model_dump_json())
    assert again.check("lookup_order", {"order_id": 7}) == "more calls than the plan allows (3 in total)"


def test_a_plan_whose_page_form_would_not_fit_is_refused_with_a_message() -> None:
    step = {"tool": "issue_refund", "at_most": {"amount_usd": "10"}}
    largest = (MAX_PLAN_FORM_FIELDS - 1) // 3
    fits = Plan.model_validate({"steps": [step] * largest})
    assert fits.form_fields == len(editable_fields(fits)) <= MAX_PLAN_FORM_FIELDS
    assert MAX_PLAN_FORM_FIELDS + len(["csrf", "reason", "verdict", "reviewed", "confirm"]) <= _MAX_FORM_FIELDS
    with pytest.raises(ValidationError, match=r"fields on its approval page.*at most 50 fit"):
        Plan.model_validate({"steps": [step] * (largest + 1)})
