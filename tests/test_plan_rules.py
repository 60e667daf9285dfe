"""Post-plan gating's pure rules, without a server: what fits a plan, and which edits narrow it."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.approval.edits import EditRejected
from handlers.approval.plan import ApprovedPlan, apply_plan_edits, describe
from handlers.contract import Outcome, Plan
from handlers.tools.policy import PlanPolicy, ToolPolicy, merge, policy_version


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
    with pytest.raises(SystemExit, match=r"APPROVALS_POLICY_FILE p.toml: plan.on_deviation"):
        merge(default, {"plan": {"on_deviation": "sometimes"}}, source="APPROVALS_POLICY_FILE p.toml")
