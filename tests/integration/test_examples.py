"""The examples run as their README says: examples/billing's tools, policy file and workflow, served
by a real stack, against the example's own fake payment provider."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.approver import submit, wait_for_email
from support.processes import REPO, IsolatedStack, StackFactory

from examples.billing.fake_payments import FakePayments


@pytest.fixture()
def payments() -> Iterator[FakePayments]:
    server = FakePayments()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture()
def billing(private_stacks: StackFactory, payments: FakePayments) -> IsolatedStack:
    return private_stacks(
        app_env={
            "COUNTERSIGN_TOOLS": "examples.billing.tools:TOOLS",
            "COUNTERSIGN_SERVICES": "examples.billing.workflow:services",
            "APPROVALS_POLICY_FILE": str(REPO / "examples/billing/policy.toml"),
            "ACME_PAYMENTS_URL": payments.url,
            "PYTHONPATH": str(REPO),
        }
    )


def test_billing_collects_an_overdue_invoice_after_its_account_manager_lowers_the_charge(
    billing: IsolatedStack, payments: FakePayments
) -> None:
    started = billing.ingress.post_json("/InvoiceCollection/inv_1001/run/send", {"requester": "alice@acme.example"})
    assert started.status_code == 202, started.text
    [mail] = wait_for_email(billing.outbox_dir, "collect-inv_1001")
    assert mail.message["To"] == "ops@acme.example", "the approver named by the policy's callable"
    assert "Charge $420.00 to card_visa42 for inv_1001" in mail.text and "12 days overdue" in mail.text
    assert [r for r in payments.requests if r[0] == "POST"] == [], "nothing is charged before the approval"
    assert submit(mail.link, "approve", edits={"amount_usd": "400.00"}).status_code == 200

    output = billing.ingress.wait_output_of("InvoiceCollection", "inv_1001").json()
    assert output["outcome"] == "approved_with_edits" and output["charged_usd"] == "400.00"
    assert output["approved_by"] == ["ops@acme.example"]
    assert [(r[1], r[2]) for r in payments.requests if r[0] == "POST"] == [("/charges", "collect-inv_1001/1")]
    assert payments.charges["collect-inv_1001/1"]["amount_usd"] == "400.00"


def test_billing_charges_a_small_invoice_alone_but_a_test_card_is_gated_by_the_policy_file(
    billing: IsolatedStack, payments: FakePayments
) -> None:
    billing.ingress.post_json("/InvoiceCollection/inv_1002/run/send", {"requester": "alice@acme.example"})
    output = billing.ingress.wait_output_of("InvoiceCollection", "inv_1002").json()
    assert output["outcome"] == "autonomous" and output["charged_usd"] == "80.00", "$80 is under the threshold"
    assert list(payments.charges) == ["collect-inv_1002/1"]

    # $15 would run alone under the code's condition; the policy file's CEL condition gates test cards.
    billing.ingress.post_json("/InvoiceCollection/inv_1003/run/send", {"requester": "alice@acme.example"})
    [mail] = wait_for_email(billing.outbox_dir, "collect-inv_1003")
    assert 'card.startsWith("card_test")' in mail.text, "the email names the rule that fired"
    assert submit(mail.link, "reject", reason="that is a test card").status_code == 200
    output = billing.ingress.wait_output_of("InvoiceCollection", "inv_1003").json()
    assert output["outcome"] == "rejected" and output["detail"] == {"reason": "that is a test card"}
    assert list(payments.charges) == ["collect-inv_1002/1"], "the rejected charge never reached the provider"
