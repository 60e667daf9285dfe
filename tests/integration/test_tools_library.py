"""Unit tests: your own tools through the public API, policy evaluation (CEL, callables, fail closed),
the refusals of COUNTERSIGN_TOOLS and the policy file (typed errors in the library, one line from the
console), which tools a process serves (the demo only in dev), and an app built from Tool objects."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import restate
from pydantic import BaseModel, ValidationError
from starlette.testclient import TestClient

import countersign
import countersign.tools
from countersign import (
    ApproverContext,
    CountersignError,
    EffectContext,
    Registry,
    ServicesError,
    SettingsError,
    Tool,
    ToolPolicy,
    ToolsError,
    create_app,
    load_tools,
)
from countersign.security import identity
from countersign.settings import Settings
from countersign.tools import DEMO_TOOLS, build_registry
from countersign.tools.policy import PolicyError, PolicyVerdict, evaluate

FINANCE = ("finance@example.com",)


class Vendor(BaseModel):
    name: str
    country: str


class PayArgs(BaseModel):
    invoice: str
    amount: Decimal
    region: str = "eu"
    vendor: Vendor = Vendor(name="Acme", country="DE")
    tags: list[str] = []


def pay(amount: str, **changes: Any) -> PayArgs:
    return PayArgs(invoice="inv_1", amount=Decimal(amount), **changes)


def gated(when: Any, **changes: Any) -> ToolPolicy:
    return ToolPolicy(gated=True, when=when, approvers=FINANCE, **changes)


def effect(args: Any, ctx: EffectContext) -> dict[str, Any]:
    return {}


def test_the_public_api_is_documented_and_light() -> None:
    for name in ("Tool", "ToolPolicy", "EditRule", "ToolError", "EffectContext", "Registry", "ApproverContext"):
        assert name in countersign.__all__
    probe = (
        "import sys, countersign; print(sorted(m for m in sys.modules if m.startswith(('countersign.', 'restate'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert (
        "countersign.runtime.app" not in loaded and "countersign.agent.run" not in loaded and "'restate" not in loaded
    ), loaded


def test_five_fields_define_a_tool_with_sensible_defaults() -> None:
    tool = Tool(name="pay", description="Pay an invoice.", args_model=PayArgs, effect=effect, policy=ToolPolicy())
    assert tool.summary(pay("12.50")).startswith("pay(invoice=inv_1, amount=12.50")
    assert tool.editable == {} and tool.precondition is None and tool.confirm_field is None
    with pytest.raises(ValueError, match="tool 'pay': confirm_field 'nope'"):
        Tool(name="pay", description="d", args_model=PayArgs, effect=effect, policy=ToolPolicy(), confirm_field="nope")
    with pytest.raises(ValueError, match="tool 'bad name'"):
        Tool(name="bad name", description="d", args_model=PayArgs, effect=effect, policy=ToolPolicy())
    # Python's `$` also matches before a final newline: the name check anchors at the very end.
    with pytest.raises(ValueError, match="name must be"):
        Tool(name="pay\n", description="d", args_model=PayArgs, effect=effect, policy=ToolPolicy())


@pytest.mark.parametrize("args", [{"amount_usd": "500.01"}, {"amount_usd": 501}])
def test_todays_conditions_keep_their_meaning(args: dict[str, Any]) -> None:
    policy = gated("amount_usd > 500")
    assert evaluate("t", policy, args).gated
    assert not evaluate("t", policy, {"amount_usd": "500.00"}).gated
    assert evaluate("t", policy, {}).gated, "a missing field fails closed"
    assert evaluate("t", policy, {"amount_usd": "lots"}).gated, "a value that is no number fails closed"
    assert not evaluate("t", gated("amount >= 100.5"), pay("100.49")).gated
    assert evaluate("t", gated("amount >= 100.5"), pay("100.50")).gated


@pytest.mark.parametrize(
    ("when", "args", "expected"),
    [
        ("amount > 500 && region == 'eu'", pay("612.40"), True),
        ("amount > 500 && region == 'eu'", pay("612.40", region="us"), False),
        ("amount > 500 || region == 'us'", pay("10", region="us"), True),
        ("amount > 500 || region == 'us'", pay("10"), False),
        ('region in ["eu", "uk"]', pay("1", region="uk"), True),
        ('region in ["eu", "uk"]', pay("1", region="us"), False),
        ('vendor.country != "DE"', pay("1", vendor=Vendor(name="X", country="FR")), True),
        ('vendor.country != "DE"', pay("1"), False),
        ('"urgent" in tags', pay("1", tags=["urgent"]), True),
        ("amount > 500.25", pay("500.26"), True),
        ("amount > 500.25", pay("500.25"), False),
    ],
)
def test_cel_expressions(when: str, args: PayArgs, expected: bool) -> None:
    assert evaluate("pay", gated(when), args).gated is expected


@pytest.mark.parametrize(
    "when",
    [
        "amount > 500 && nothing_like_this == 1",  # an undefined name
        "region > 5",  # no such overload: string against number
        "region",  # not a boolean
        "vendor.city == 'Berlin'",  # a missing nested field
    ],
)
def test_cel_fails_closed(when: str) -> None:
    assert evaluate("pay", gated(when), pay("600")).gated


def test_invalid_conditions_are_refused_when_the_policy_is_built() -> None:
    for when in ["amount >", "__import__('os')", "amount.exec('rm')", "x" * 2001]:
        with pytest.raises(ValidationError):
            gated(when)


def test_callables_decide_and_name_approvers_as_plain_data() -> None:
    seen: list[ApproverContext] = []

    def managers(context: ApproverContext) -> list[str]:
        seen.append(context)
        manager = f"manager-of-{context.requester.split('@')[0]}@example.com"
        return [manager, f"Oncall-{context.tenant}@example.com"]

    policy = ToolPolicy(gated=True, when=lambda a: a.amount > 500, approvers_from=managers, quorum=2)
    verdict = evaluate("pay", policy, pay("600"), requester="alice@example.com", tenant="acme")
    assert verdict.gated
    assert verdict.policy.approvers == ("manager-of-alice@example.com", "oncall-acme@example.com")
    assert verdict.policy.approvers_from is None and verdict.policy.when is None
    assert "managers()" in verdict.rule and "pay: needs approval when a condition in code holds, 2 of" in verdict.rule
    assert seen[0].tool == "pay" and isinstance(seen[0].args, PayArgs) and seen[0].tenant == "acme"
    assert PolicyVerdict.model_validate_json(verdict.model_dump_json()) == verdict, "journaled and read back"

    low = evaluate("pay", policy, pay("10"), requester="alice@example.com", tenant="acme")
    assert not low.gated and len(seen) == 1, "no one is named for a call nobody is asked about"
    assert PolicyVerdict.model_validate_json(low.model_dump_json()) == low


def test_a_condition_callable_that_raises_or_answers_no_boolean_gates() -> None:
    def broken(args: PayArgs) -> bool:
        raise KeyError("limit")

    assert evaluate("pay", gated(broken), pay("1")).gated
    assert evaluate("pay", gated(lambda a: "yes"), pay("1")).gated
    assert not evaluate("pay", gated(lambda a: False), pay("1")).gated


@pytest.mark.parametrize(
    ("approvers", "message"),
    [
        (lambda c: ["not-an-email"], "is not an email address"),
        (lambda c: [], "at least one approver"),
        (lambda c: "boss@example.com", "must be a list"),
        (lambda c: ["a@example.com", "A@example.com"], "listed twice"),
        (lambda c: int("boom"), "could not be named: ValueError"),
    ],
)
def test_approver_callables_are_validated_like_static_approvers(approvers: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        evaluate("pay", ToolPolicy(gated=True, approvers_from=approvers), pay("1"))


def test_a_callable_is_accepted_as_approvers_too() -> None:
    policy = ToolPolicy.model_validate({"gated": True, "approvers": lambda c: ["boss@example.com"]})
    assert policy.approvers == () and policy.approvers_from is not None
    assert evaluate("pay", policy, pay("1")).policy.approvers == ("boss@example.com",)
    with pytest.raises(ValidationError, match="not both"):
        ToolPolicy(gated=True, approvers=FINANCE, approvers_from=lambda c: ["boss@example.com"])


def test_the_policy_file_overrides_a_loaded_tool_even_a_callable(tmp_path: Path) -> None:
    tool = Tool(
        name="pay",
        description="Pay.",
        args_model=PayArgs,
        effect=effect,
        policy=ToolPolicy(gated=True, when=lambda a: True, approvers_from=lambda c: ["m@example.com"]),
    )
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(
        '[tools.pay]\nwhen = "amount > 100 && region == \\"eu\\""\napprovers = ["cfo@example.com"]\n'
    )
    [loaded] = Registry([tool], policy_file)
    assert loaded.policy.when == 'amount > 100 && region == "eu"' and loaded.policy.approvers_from is None
    assert evaluate("pay", loaded.policy, pay("101")).policy.approvers == ("cfo@example.com",)
    assert not evaluate("pay", loaded.policy, pay("99")).gated


# --------------------------------------------------------------------------------------------------
# Loading: each problem is a typed error (never SystemExit) of one line naming the setting and what is wrong.

_names = itertools.count()


@pytest.fixture()
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str) -> str:
        name = f"own_tools_{next(_names)}"
        header = "from pydantic import BaseModel\nfrom countersign import Tool, ToolPolicy\n"
        header += "class A(BaseModel):\n    n: int\ndef fx(args, ctx):\n    return {}\n"
        (tmp_path / f"{name}.py").write_text(header + textwrap.dedent(body))
        return name

    return write


def tool_line(name: str, policy: str = "ToolPolicy()") -> str:
    return f"Tool(name={name!r}, description='d', args_model=A, effect=fx, policy={policy})"


def refusal(spec: str, policy_file: Path | None = None, kind: type[CountersignError] = ToolsError) -> str:
    with pytest.raises(CountersignError) as caught:
        Registry(load_tools(spec), policy_file)
    assert type(caught.value) is kind, repr(caught.value)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_loading_tools_by_import_path(module: Any) -> None:
    first = module(f"TOOLS = [{tool_line('a')}]")
    second = module(f"from countersign import Registry\nREG = Registry([{tool_line('b')}])")
    assert [t.name for t in load_tools(f"{first}:TOOLS,{second}:REG")] == ["a", "b"]


def test_a_bad_module_path_is_refused() -> None:
    message = refusal("no_such_module_here.tools:TOOLS")
    assert message.startswith("COUNTERSIGN_TOOLS=no_such_module_here.tools:TOOLS") and "no module named" in message


def test_a_module_that_fails_to_import_is_refused_with_where(module: Any) -> None:
    name = module("import json\nBROKEN = json.loads('{')\n")
    message = refusal(f"{name}:TOOLS")
    assert f"importing {name} failed: JSONDecodeError" in message and f"{name}.py:8" in message


def test_a_missing_attribute_is_refused(module: Any) -> None:
    name = module(f"TOOLS = [{tool_line('a')}]")
    assert refusal(f"{name}:TOLS") == f"COUNTERSIGN_TOOLS={name}:TOLS: module {name} has no attribute 'TOLS'"


def test_something_that_is_not_tools_is_refused(module: Any) -> None:
    name = module(f"ONE = {tool_line('a')}\nMIXED = [{tool_line('a')}, 'b']\n")
    assert "is a Tool, not a list of Tool or a Registry" in refusal(f"{name}:ONE")
    assert "item 1 is a str, not a countersign.Tool" in refusal(f"{name}:MIXED")


def test_duplicate_names_are_refused(module: Any) -> None:
    first, second = module(f"TOOLS = [{tool_line('pay')}]"), module(f"TOOLS = [{tool_line('pay')}]")
    message = refusal(f"{first}:TOOLS,{second}:TOOLS")
    assert message == f"COUNTERSIGN_TOOLS: tool name 'pay' is defined twice ({first}:TOOLS, {second}:TOOLS)"


def test_an_invalid_policy_in_code_is_refused_naming_where(module: Any) -> None:
    name = module(f"TOOLS = [{tool_line('pay', 'ToolPolicy(gated=True)')}]")
    message = refusal(f"{name}:TOOLS")
    assert "a gated tool needs at least one approver" in message and f"{name}.py:7" in message


def test_an_invalid_policy_in_the_file_is_refused_naming_the_tool(module: Any, tmp_path: Path) -> None:
    name = module(f"TOOLS = [{tool_line('pay')}]")
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[tools.pay]\ngated = true\nwhen = "n >"\napprovers = ["a@example.com"]\n')
    message = refusal(f"{name}:TOOLS", policy_file, PolicyError)
    assert message.startswith("APPROVALS_POLICY_FILE [tools.pay]: when:") and "not a valid CEL expression" in message


def test_a_policy_file_naming_a_tool_that_is_not_loaded_is_refused(module: Any, tmp_path: Path) -> None:
    name = module(f"TOOLS = [{tool_line('pay')}]")
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text("[tools.issue_refund]\ngated = false\n")
    message = refusal(f"{name}:TOOLS", policy_file, PolicyError)
    assert message.startswith("APPROVALS_POLICY_FILE names tools that are not loaded: ['issue_refund']")


def test_the_setting_is_checked_for_form() -> None:
    assert Settings.model_validate({"countersign_tools": " a.b:TOOLS , c:R"}).countersign_tools == ("a.b:TOOLS", "c:R")
    assert Settings().countersign_tools == ()
    for bad in ["a.b", "a.b:TOOLS:x", "a b:T", "a:T,a:T"]:
        with pytest.raises(ValidationError, match="COUNTERSIGN_TOOLS"):
            Settings.model_validate({"countersign_tools": bad})


# --------------------------------------------------------------------------------------------------
# The library boundary: library calls raise the family; only the console command exits.


def test_library_calls_raise_typed_errors_and_never_exit() -> None:
    for specs in (["nope:X"], "nope:X", "not a path"):
        with pytest.raises(ToolsError) as refused:
            load_tools(specs)
        assert isinstance(refused.value, CountersignError) and refused.value.setting == "COUNTERSIGN_TOOLS"
        assert str(refused.value).startswith("COUNTERSIGN_TOOLS")
    pay = Tool(name="pay", description="Pay.", args_model=PayArgs, effect=effect, policy=ToolPolicy())
    with pytest.raises(ToolsError, match=r"^code: tool name 'pay' is defined twice$"):
        Registry([pay, pay])
    family = (CountersignError, SettingsError, ToolsError, PolicyError, ServicesError)
    assert all(issubclass(kind, CountersignError) and kind.__name__ in countersign.__all__ for kind in family)
    assert PolicyError is countersign.PolicyError and issubclass(ServicesError, ValueError)
    from countersign.runtime.services import ServicesError as where_it_was

    assert where_it_was is ServicesError


def clean_env(tmp_path: Path, **values: str) -> dict[str, str]:
    """This machine's environment without any Countersign, Restate or approvals setting, plus `values`."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("COUNTERSIGN_", "RESTATE_", "APPROVALS_"))}
    return {**keep, "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 32, "APPROVALS_OUTBOX_DIR": str(tmp_path), **values}


def stderr_lines(command: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    done = subprocess.run(command, env=env, cwd=env["APPROVALS_OUTBOX_DIR"], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


SERVE = ["serve", "--bind", "127.0.0.1:1"]
# What the `countersign` script does: import the entry point (which runs nothing), then call it.
CONSOLE_SCRIPT = "\n".join(
    ["import sys", "from countersign.__main__ import console", f"sys.argv = ['countersign', *{SERVE!r}]", "console()"]
)


def test_both_spellings_of_the_command_import_tools_from_the_folder_they_run_in(tmp_path: Path) -> None:
    """`countersign serve` (the installed script) finds a tools module in the current folder, as
    `python -m countersign serve` does: the module is imported (it names no tools), not missing."""
    (tmp_path / "mine_here.py").write_text("TOOLS: list[object] = []\n")
    env = clean_env(tmp_path, COUNTERSIGN_ENV="test", COUNTERSIGN_TOOLS="mine_here:TOOLS")
    said = "COUNTERSIGN_TOOLS=mine_here:TOOLS: names no tools"
    script = str(Path(sys.executable).parent / "countersign")
    for command in ([script, *SERVE], [sys.executable, "-m", "countersign", *SERVE]):
        assert stderr_lines(command, env) == (1, [said]), command


def test_the_console_turns_a_library_error_into_one_line_and_exit_1(tmp_path: Path) -> None:
    env = clean_env(tmp_path, COUNTERSIGN_ENV="test", COUNTERSIGN_TOOLS="nope.tools:X")
    said = "COUNTERSIGN_TOOLS=nope.tools:X: no module named 'nope.tools' (is it on sys.path?)"
    # `python -m countersign`, and the console script's entry point `countersign.__main__:console`.
    for command in ([sys.executable, "-m", "countersign", *SERVE], [sys.executable, "-c", CONSOLE_SCRIPT]):
        assert stderr_lines(command, env) == (1, [said]), command


@pytest.mark.parametrize("mode", ["production", "test"])
def test_serve_outside_dev_without_tools_stops_with_one_line_naming_the_setting(tmp_path: Path, mode: str) -> None:
    keys = {
        "RESTATE_IDENTITY_KEYS": identity.ensure_key_pair(tmp_path / "id.pem"),
        "COUNTERSIGN_JOURNAL_KEYS": "j1:" + "A" * 43 + "=",
    }
    env = clean_env(tmp_path, COUNTERSIGN_ENV=mode, **keys)
    code, lines = stderr_lines([sys.executable, "-m", "countersign", *SERVE], env)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("COUNTERSIGN_TOOLS is not set and no tools were given to create_app(tools=...)")


def test_the_demo_tools_load_unnamed_only_in_dev() -> None:
    dev = build_registry(Settings(countersign_env="dev", countersign_tools=()))
    assert "issue_refund" in dev.names() and dev.source.startswith("the demo tools")
    for mode in ("test", "production"):
        with pytest.raises(SettingsError, match=r"^COUNTERSIGN_TOOLS is not set") as refused:
            build_registry(Settings(countersign_env=mode, countersign_tools=()))
        assert refused.value.setting == "COUNTERSIGN_TOOLS"
    named = build_registry(Settings(countersign_env="production", countersign_tools=(DEMO_TOOLS,)))
    assert named.names() == dev.names() and named.source == f"COUNTERSIGN_TOOLS={DEMO_TOOLS}"


def test_a_process_that_serves_its_own_handlers_may_serve_no_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Questions with `ask_person` need no tool: naming services is enough, outside dev too. In dev,
    a checkout still serves the demo tools beside them; an installed wheel, which has none, does not."""
    own = ["desk.services:services"]
    for mode in ("test", "production"):
        served = build_registry(Settings(countersign_env=mode, countersign_tools=(), countersign_services=own))
        assert served.names() == [] and served.source.startswith("none (COUNTERSIGN_TOOLS is unset;")
        in_code = build_registry(Settings(countersign_env=mode, countersign_tools=()), own_services=True)
        assert in_code.names() == []
    checkout = build_registry(Settings(countersign_env="dev", countersign_tools=(), countersign_services=own))
    assert "issue_refund" in checkout.names()
    monkeypatch.setattr(countersign.tools, "DEMO_TOOLS", "not_installed.demo.tools:DEMO_TOOLS")
    wheel = build_registry(Settings(countersign_env="dev", countersign_tools=(), countersign_services=own))
    assert wheel.names() == []
    with pytest.raises(ToolsError, match="not_installed"):
        build_registry(Settings(countersign_env="dev", countersign_tools=()))


def test_create_app_builds_an_app_from_tool_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(countersign.tools, "_process", None)  # the tests' own demo tools come back after
    settings = Settings(
        countersign_env="production",
        countersign_tools=(),
        approvals_signing_keys={"k1": b"s" * 40},
        approvals_outbox_dir=tmp_path,
    )
    with pytest.raises(SettingsError, match=r"^COUNTERSIGN_TOOLS is not set"):
        create_app(settings)
    # Services of your own given in code and no tools (questions only, say): it serves none.
    assert TestClient(create_app(settings, [restate.Service("SupportDesk")])).get("/healthz").text == "ok"
    assert countersign.tools.default_registry().names() == []
    pay = Tool(name="pay", description="Pay.", args_model=PayArgs, effect=effect, policy=gated("amount > 100"))
    app = create_app(settings, tools=[pay])
    assert TestClient(app).get("/healthz").text == "ok"
    served = countersign.tools.default_registry()
    assert served.names() == ["pay"] and served.source == "create_app(tools=...)"
    with pytest.raises(ToolsError, match=r"tool name 'pay' is defined twice"):
        create_app(settings, tools=[pay, pay])
    with pytest.raises(ToolsError, match=r"item 0 is a str, not a countersign.Tool \(import paths go in COUNTERSIGN_"):
        create_app(settings, tools=["pkg.tools:TOOLS"])  # type: ignore[list-item]
