"""Unit tests of the security parts that need no server: the journal cipher, error scrubbing,
settings that must fail fast, typed confirmation and high-stakes policies."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import tracemalloc
import zlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from restate import TerminalError
from restate.exceptions import RetryableError
from support.records import approval_record

from countersign.approval import confirm
from countersign.contract import EMAIL_PATTERN, AgentTask, ApprovalRecord, ReassignRequest
from countersign.exceptions import SettingsError
from countersign.llm import ModelUnavailable, parse_model_id
from countersign.runtime import startup
from countersign.security import identity, links
from countersign.security.codec import (
    COMPRESS_FROM,
    ENVELOPE,
    ENVELOPE_V1,
    ENVELOPE_V2,
    MAX_OPENED,
    JournalCipher,
    JournalValueUnreadable,
    journal_codec,
)
from countersign.security.redact import ScrubbedError, clean_failures, scrub, scrubbed
from countersign.settings import Settings, parse_journal_keys
from countersign.tools import default_registry
from countersign.tools.policy import ToolPolicy, evaluate

T = TypeVar("T")
K1, K0 = os.urandom(32), os.urandom(32)
VALUE = json.dumps({"requester": "alice@example.com", "reason": "damaged in transit"}).encode()
BIG = json.dumps([{"requester": "alice@example.com", "reason": f"damaged in transit {i}"} for i in range(20)]).encode()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def finish(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits on I/O, without an event loop (another test's may be running)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise AssertionError("the coroutine waited on something")


# -- journal cipher -------------------------------------------------------------------------------


def test_cipher_seals_as_a_json_envelope_and_opens_it() -> None:
    cipher = JournalCipher({"j1": K1})
    sealed = cipher.encode(VALUE)
    assert sealed.startswith(ENVELOPE) and b"alice" not in sealed and b"damaged" not in sealed
    assert list(json.loads(sealed)) == ["countersign:v1"]
    assert cipher.encode(VALUE) != sealed, "a fresh nonce per value"
    assert cipher.open(sealed) == VALUE and finish(cipher.decode(sealed)) == VALUE


def test_cipher_rotation_first_key_seals_all_open() -> None:
    old = JournalCipher({"j0": K0}).encode(VALUE)
    rotated = JournalCipher({"j1": K1, "j0": K0})
    assert rotated.open(old) == VALUE
    assert rotated.encode(VALUE).startswith(ENVELOPE_V1 + b"j1.")
    with pytest.raises(JournalValueUnreadable, match="'j0'"):
        JournalCipher({"j1": K1}).open(old)
    with pytest.raises(JournalValueUnreadable):
        JournalCipher({"j0": K1}).open(old)


@pytest.mark.parametrize("value", [VALUE, BIG], ids=["v1", "v2"])
def test_cipher_refuses_every_altered_character(value: bytes) -> None:
    cipher = JournalCipher({"j1": K1})
    sealed = cipher.encode(value)
    start = len(ENVELOPE_V1) + len(b"j1.")
    for i in range(start, len(sealed) - 2):
        altered = sealed[:i] + (b"A" if sealed[i : i + 1] != b"A" else b"B") + sealed[i + 1 :]
        with pytest.raises(JournalValueUnreadable):
            cipher.open(altered)
    with pytest.raises(JournalValueUnreadable):
        cipher.open(sealed[:-5] + b'"}')
    with pytest.raises(JournalValueUnreadable):
        cipher.open(sealed[:-2])


def test_cipher_binds_the_key_id() -> None:
    """The kid is authenticated data: relabelling a value as another key's is refused."""
    both = JournalCipher({"j1": K1, "j2": K1})
    sealed = both.encode(VALUE)
    with pytest.raises(JournalValueUnreadable):
        both.open(sealed.replace(b'"j1.', b'"j2.', 1))


def test_cipher_passes_plain_json_and_empty_values_through() -> None:
    cipher = JournalCipher({"j1": K1})
    assert cipher.open(b'{"goal": "x"}') == b'{"goal": "x"}', "a body sent with curl"
    assert cipher.encode(b"") == b"" and cipher.open(b"") == b""


def test_cipher_format_is_aes_256_gcm_with_the_kid_as_associated_data() -> None:
    sealed = JournalCipher({"j1": K1}).encode(VALUE)
    payload = json.loads(sealed)["countersign:v1"].split(".", 1)[1]
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    assert AESGCM(K1).decrypt(raw[:12], raw[12:], b"countersign.journal.v1\x00j1") == VALUE


def test_v2_format_is_raw_deflate_sealed_with_the_version_and_kid_as_associated_data() -> None:
    sealed = JournalCipher({"j1": K1}).encode(BIG)
    assert list(json.loads(sealed)) == ["countersign:v2"] and sealed.startswith(ENVELOPE_V2 + b"j1.")
    payload = json.loads(sealed)["countersign:v2"].split(".", 1)[1]
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    packed = AESGCM(K1).decrypt(raw[:12], raw[12:], b"countersign.journal.v2\x00j1")
    assert zlib.decompress(packed, wbits=-15) == BIG


def seal_v2(packed: bytes, *, aad: bytes = b"countersign.journal.v2\x00j1") -> bytes:
    """A v2 envelope around any DEFLATE bytes, sealed as a holder of the key could."""
    nonce = os.urandom(12)
    payload = base64.urlsafe_b64encode(nonce + AESGCM(K1).encrypt(nonce, packed, aad)).rstrip(b"=")
    return ENVELOPE_V2 + b"j1." + payload + b'"}'


def deflate(plain: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(plain) + packer.flush()


def test_values_from_the_threshold_on_are_compressed_and_round_trip() -> None:
    cipher = JournalCipher({"j1": K1})
    small, large = b'{"a":"' + b"x" * (COMPRESS_FROM - 9) + b'"}', b'{"a":"' + b"x" * (COMPRESS_FROM - 8) + b'"}'
    assert len(small) == COMPRESS_FROM - 1 and len(large) == COMPRESS_FROM
    assert cipher.encode(small).startswith(ENVELOPE_V1) and cipher.encode(large).startswith(ENVELOPE_V2)
    assert cipher.open(cipher.encode(small)) == small and finish(cipher.decode(cipher.encode(large))) == large
    incompressible = os.urandom(600)
    assert cipher.encode(incompressible).startswith(ENVELOPE_V1), "v2 only when it is shorter"
    assert cipher.open(cipher.encode(incompressible)) == incompressible


# Written by the code before v2 existed (key OLD_KEY, kid "old"): journals of that time must still replay.
OLD_KEY = bytes(range(32))
OLD_SMALL = (
    b'{"countersign:v1":"old.3rDcfXVbU3aFFL7-q2Xfs0WqX7bq4xDbRhCwyP8qHn61LcC83YvrKCn6DXbD1g7rb0ceW9wMM88R2a6aECDMfgE6'
    b'ZvmBiwqOdk3WUCy0wx-SZhvD75b6m0tDAA"}'
)
OLD_LARGE = (
    b'{"countersign:v1":"old.PjGV5Fou5Ht39NrF4nvsVw50PY818Rocd1jbwO5rYmwWyNFXsDKFJBQtne8bhLYSTJ57A__nCYO_pLQCCdeaBNCk'
    b"mPYTrvSoyQWFK-6H5YUc0qkz_w_khV6S4kWvatl3uEWMqfvrFZ5rZN9ZZvmXqaXw1V_H48lYnRN5Uxc-AkSSmOBvD9wTTHHpwAfZCdPy4bUx1hK"
    b"4yMv6lUTVJnh6U4oX0Y4njq8f9Oo8tmoutnIinoPDLs_YCbDWh-2mvs4PkSyFZDaBQBzIQCJs2OQL76tLhgAB5Wx6RK6EG5ykrj7AeTokEhnJTy2"
    b"27DwrhKVgKz3pLNRb3mehIFkgQ1txm0JsuoInOEl-3JWmWB_pSY7uv4xSk4lxfW1ZVLWAfxN42IMIeijL12rupqSiwfJNyemZFENPFaCfU6depvn"
    b'jUewRBDs1Vfplwi3Cf-vffRO1DOFuVXF8PxFyWFaLPtaE_3idvUivptSr0POyaq_7UqGdlE4F_a6h"}'
)


def test_v1_values_written_before_compression_still_open() -> None:
    cipher = JournalCipher({"new": K1, "old": OLD_KEY})
    assert cipher.open(OLD_SMALL) == b'{"requester":"alice@example.com","reason":"damaged in transit"}'
    assert cipher.open(OLD_LARGE) == b'{"note":"' + b"written before compression; " * 12 + b'"}'
    assert len(cipher.open(OLD_LARGE)) >= COMPRESS_FROM, "a value that v2 would now compress"


def test_the_version_is_authenticated_both_ways() -> None:
    cipher = JournalCipher({"j1": K1})
    v2, v1 = cipher.encode(BIG), cipher.encode(VALUE)
    assert v2.startswith(ENVELOPE_V2) and v1.startswith(ENVELOPE_V1)
    with pytest.raises(JournalValueUnreadable, match="authentication"):
        cipher.open(ENVELOPE_V1 + v2[len(ENVELOPE_V2) :])
    with pytest.raises(JournalValueUnreadable, match="authentication"):
        cipher.open(ENVELOPE_V2 + v1[len(ENVELOPE_V1) :])
    # A v1 seal around DEFLATE bytes is opened as v1: the compressed bytes, never inflated.
    relabelled = seal_v2(deflate(BIG), aad=b"countersign.journal.v1\x00j1").replace(ENVELOPE_V2, ENVELOPE_V1, 1)
    assert cipher.open(relabelled) == deflate(BIG)


def test_an_unknown_envelope_version_is_refused_not_passed_through() -> None:
    cipher = JournalCipher({"j1": K1})
    future = cipher.encode(BIG).replace(ENVELOPE_V2, ENVELOPE + b'3":"', 1)
    with pytest.raises(JournalValueUnreadable, match="version v3"):
        cipher.open(future)
    assert cipher.open(b'{"countersign:verbose": true}') == b'{"countersign:verbose": true}', "plain JSON"


def test_a_decompression_bomb_is_refused_without_inflating_it_all() -> None:
    """Sealed with the key, so it authenticates: only the size limit stops it. Inflating it whole
    would take 8x the limit (its 128 MiB, and the buffer it grows from); bounded it is about 2x."""
    cipher = JournalCipher({"j1": K1})
    packer, zeros = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(2**20)
    bomb = seal_v2(b"".join(packer.compress(zeros) for _ in range(4 * MAX_OPENED // len(zeros))) + packer.flush())
    assert len(bomb) < 256 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(JournalValueUnreadable, match="inflates past 32 MiB"):
            cipher.open(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_OPENED, f"opening it took {peak / 2**20:.0f} MiB"
    just_over = seal_v2(deflate(b"0" * (MAX_OPENED + 1)))
    with pytest.raises(JournalValueUnreadable, match="inflates past 32 MiB"):
        cipher.open(just_over)
    at_the_limit = b"0" * MAX_OPENED
    assert cipher.open(seal_v2(deflate(at_the_limit))) == at_the_limit
    assert cipher.encode(at_the_limit + b"0").startswith(ENVELOPE_V1), "never compresses what it would refuse"


def test_a_v2_plaintext_that_is_not_one_whole_deflate_stream_is_refused() -> None:
    cipher = JournalCipher({"j1": K1})
    whole = deflate(BIG)
    for packed in (whole[:-3], whole + b"trailing", b"\xff" * 40, b""):
        with pytest.raises(JournalValueUnreadable):
            cipher.open(seal_v2(packed))


def test_compression_can_be_switched_off_for_an_upgrade_and_reading_stays_on() -> None:
    keys = f"j1:{b64(K1)}"
    on = journal_codec(Settings(countersign_journal_keys=keys))  # type: ignore[arg-type]
    off = journal_codec(Settings(countersign_journal_keys=keys, countersign_journal_compress="false"))  # type: ignore[arg-type]
    assert on is not None and off is not None
    assert on.encode(BIG).startswith(ENVELOPE_V2) and off.encode(BIG).startswith(ENVELOPE_V1)
    assert off.open(on.encode(BIG)) == BIG == on.open(off.encode(BIG))
    with pytest.raises(ValidationError, match="countersign_journal_compress"):
        Settings(countersign_journal_compress="maybe")  # type: ignore[arg-type]


def realistic_record() -> ApprovalRecord:
    """Shaped like a demo run's record: random digest and nonce, the facts and trail the tool gave."""
    return ApprovalRecord.model_validate(
        approval_record().model_dump()
        | {
            "approval_id": "b88c41d-cap-co-0-a1",
            "run_id": "b88c41d-cap-co-0",
            "args": {"order_id": 10000000, "amount_usd": "800.00", "reason": "Refund order 10000000 for $800.00"},
            "digest": secrets.token_hex(32),
            "nonces": [secrets.token_urlsafe(16)],
            "summary": "Refund $800.00 to order 10000000",
            "why": "The requester asked: Refund order 10000000 for $800.00",
            "policy": "issue_refund: needs approval when amount_usd > 500",
            "editable": {"amount_usd": "may only be lowered"},
            "context": [
                {"label": "Order total", "value": "$10000.00"},
                {"label": "Already refunded", "value": "$0.00"},
                {"label": "Customer since", "value": "2019-03-14"},
                {"label": "Refunds in the last 90 days", "value": "0 ($0.00) for c_17"},
            ],
            "trail": [
                {
                    "index": 0,
                    "tool": "lookup_order",
                    "outcome": "autonomous",
                    "args": '{"order_id": 10000000}',
                    "result": '{"amount_usd": "10000.00", "customer_id": "c_17", "order_id": 10000000, '
                    '"refunded_usd": "0.00", "status": "paid"}',
                }
            ],
        }
    )


def test_a_realistic_record_is_at_least_a_third_smaller_sealed() -> None:
    cipher = JournalCipher({"j1": K1})
    plain = realistic_record().model_dump_json().encode()
    assert len(plain) > 1000
    before = (
        len(ENVELOPE_V1 + b"j1.") + len(base64.urlsafe_b64encode(os.urandom(12 + len(plain) + 16)).rstrip(b"=")) + 2
    )
    sealed = cipher.encode(plain)
    assert sealed.startswith(ENVELOPE_V2) and before >= 1.5 * len(sealed), (before, len(sealed))
    assert ApprovalRecord.model_validate_json(cipher.open(sealed)) == ApprovalRecord.model_validate_json(plain)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_cipher_round_trips_any_bytes_and_open_never_crashes(buf: bytes) -> None:
    cipher = JournalCipher({"j1": K1})
    assert cipher.open(cipher.encode(buf)) == buf
    for prefix in (ENVELOPE, ENVELOPE_V1, ENVELOPE_V2):
        with contextlib.suppress(JournalValueUnreadable):
            cipher.open(prefix + buf)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(["alice", '"amount_usd"', "800.00", "{", "}", ",", " "]), max_size=600),
    st.binary(max_size=40),
)
def test_cipher_round_trips_compressible_values(words: list[str], noise: bytes) -> None:
    cipher = JournalCipher({"j1": K1})
    buf = "".join(words).encode() + noise
    sealed = cipher.encode(buf)
    assert cipher.open(sealed) == buf
    if len(buf) >= 400:  # mostly seven words: DEFLATE always wins at that length
        assert sealed.startswith(ENVELOPE_V2)


def test_journal_key_settings() -> None:
    keys = parse_journal_keys(f"j1:{b64(K1)}, j0:{base64.urlsafe_b64encode(K0).decode().rstrip('=')}")
    assert keys == {"j1": K1, "j0": K0} and list(keys) == ["j1", "j0"]
    assert Settings(countersign_journal_keys=f"j1:{b64(K1)}").journal_kid == "j1"  # type: ignore[arg-type]
    for bad in ("j1", f"j1:{b64(K1)[:-4]}", "j1:not*base64*at*all*!!!!!!!!!!!!!!!!", f"j1:{b64(K1)},j1:{b64(K0)}"):
        with pytest.raises(ValueError):
            parse_journal_keys(bad)
    with pytest.raises(ValidationError, match="32 random bytes"):
        Settings(countersign_journal_keys="j1:" + b64(os.urandom(16)))  # type: ignore[arg-type]


# -- identity keys and startup ---------------------------------------------------------------------


def test_identity_key_pair_file_and_public_key_form(tmp_path: Path) -> None:
    pem = tmp_path / "keys" / "identity.pem"
    public = identity.ensure_key_pair(pem)
    assert pem.stat().st_mode & 0o777 == 0o600
    assert identity.ensure_key_pair(pem) == public, "an existing key is kept"
    assert public.startswith("publickeyv1_") and 43 <= len(public) - len("publickeyv1_") <= 44
    assert identity.base58(b"\0\0\x01") == "112" and identity.base58(bytes(range(1, 5))) == "2VfUX"
    assert Settings(restate_identity_keys=public).restate_identity_keys == [public]  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="identity key"):
        Settings(restate_identity_keys="publickeyv1_0OIl")  # type: ignore[arg-type]


def production(**values: Any) -> Settings:
    return Settings(countersign_env="production", approvals_signing_keys="k1:" + "s" * 32, **values)  # type: ignore[arg-type]


def test_production_refuses_to_start_without_identity_or_journal_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    public = identity.ensure_key_pair(tmp_path / "id.pem")
    ok = {"restate_identity_keys": public, "countersign_journal_keys": f"j1:{b64(K1)}"}
    outbox = {"approvals_outbox_dir": tmp_path / "outbox"}
    with pytest.raises(SettingsError, match="RESTATE_IDENTITY_KEYS"):
        startup.check(production(**{**ok, "restate_identity_keys": ""}, **outbox))
    with pytest.raises(SettingsError, match="COUNTERSIGN_JOURNAL_KEYS"):
        startup.check(production(**{**ok, "countersign_journal_keys": ""}, **outbox))
    with caplog.at_level("WARNING", logger="countersign.runtime.startup"):
        startup.check(production(**ok, **outbox))
        assert not caplog.records, "production with its keys starts without a warning"
        startup.check(Settings(countersign_env="dev", approvals_signing_keys="k1:" + "s" * 32, **outbox))  # type: ignore[arg-type]
    # Dev may run without them, but says so: nobody should take a plaintext journal for a sealed one.
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 2
    assert warned[0].startswith("RESTATE_IDENTITY_KEYS is not set: the Restate endpoint accepts unsigned requests")
    assert warned[1].startswith("COUNTERSIGN_JOURNAL_KEYS is not set: journal values (arguments, emails) are stored")


# -- scrubbing failures, which bypass the codec ----------------------------------------------------


def test_scrub_removes_emails_and_link_tokens() -> None:
    token = "v1.k1.cnVuLTF-Mn4xfjF-MjAwMA.JsjFP0qa_D-o5D7wBpQwB4MysHuvPQl-t_ExtgP5WE8"
    text = f"input_value='Alice.O+tag@mail.example.co.uk' for {token}; bob@example.com, too"
    assert scrub(text) == "input_value='[email]' for [link token]; [email], too"
    assert scrub("order 1042 has only $0.00 left") == "order 1042 has only $0.00 left"


def raises(action: Callable[[], Any]) -> BaseException:
    try:
        action()
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_scrubbed_steps_fail_without_personal_data_or_causes() -> None:
    def sync_fail() -> int:
        try:
            raise ValueError("inner alice@example.com")
        except ValueError as exc:
            raise RuntimeError("failed for alice@example.com") from exc

    async def async_fail() -> int:
        raise TerminalError("no such user bob@example.com", 404)

    def retry_fail() -> int:
        raise RetryableError("busy for carol@example.com", 503)

    plain = raises(scrubbed(sync_fail))
    assert isinstance(plain, ScrubbedError) and repr(plain) == "RuntimeError('failed for [email]')"
    assert plain.__cause__ is None and plain.__suppress_context__
    terminal = raises(lambda: finish(scrubbed(async_fail)()))
    assert isinstance(terminal, TerminalError) and (terminal.message, terminal.status_code) == (
        "no such user [email]",
        404,
    )
    retry = raises(scrubbed(retry_fail))
    assert isinstance(retry, RetryableError) and retry.message == "busy for [email]" and retry.status_code == 503
    assert scrubbed(lambda x: x + 1)(1) == 2


def test_scrubbed_keeps_the_signature_the_sdk_reads_for_its_serde() -> None:
    import inspect

    from countersign.agent.model_turn import model_turn as _model_turn

    assert inspect.signature(_model_turn, eval_str=True).return_annotation.__name__ == "Turn"
    assert inspect.iscoroutinefunction(scrubbed(async_noop)) and not inspect.iscoroutinefunction(scrubbed(len))


async def async_noop() -> None:
    return None


def in_invocation(error: BaseException) -> BaseException:
    async def handler() -> None:
        async with clean_failures():
            raise error

    return raises(lambda: finish(handler()))


def test_invocation_failures_are_scrubbed_and_bad_input_is_a_400() -> None:
    failed = in_invocation(TerminalError("dave@example.com already decides this", 400))
    assert isinstance(failed, TerminalError) and (failed.message, failed.status_code) == (
        "[email] already decides this",
        400,
    )
    parse = in_invocation(TerminalError("Unable to parse an input argument. input_value='eve@example.com'"))
    assert isinstance(parse, TerminalError) and parse.status_code == 400 and "eve" not in parse.message
    cancelled = in_invocation(TerminalError("cancelled", 409))
    assert isinstance(cancelled, TerminalError) and (cancelled.message, cancelled.status_code) == ("cancelled", 409)
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = TerminalError("for frank@example.com", 403)
    unwrapped = in_invocation(wrapped)
    assert isinstance(unwrapped, TerminalError) and (unwrapped.message, unwrapped.status_code) == ("for [email]", 403)
    bug = in_invocation(KeyError("grace@example.com"))
    assert isinstance(bug, ScrubbedError) and "grace" not in str(bug)
    assert isinstance(in_invocation(asyncio.CancelledError()), asyncio.CancelledError), "not an Exception: untouched"


# -- high stakes: policy and typed confirmation ----------------------------------------------------


def test_high_stakes_policies() -> None:
    refund = default_registry().get("issue_refund")
    delete = default_registry().get("delete_customer")
    assert refund is not None and delete is not None
    assert not evaluate("issue_refund", refund.policy, {"amount_usd": "1000.00"}).high_stakes
    assert evaluate("issue_refund", refund.policy, {"amount_usd": "1000.01"}).high_stakes
    assert not evaluate("issue_refund", refund.policy, {"amount_usd": "100.00"}).high_stakes, "not even gated"
    assert evaluate("delete_customer", delete.policy, {"customer_id": "c_1"}).high_stakes
    with pytest.raises(ValidationError, match="needs high_stakes"):
        ToolPolicy(gated=True, approvers=("a@example.com",), high_stakes_when="amount_usd > 5")
    with pytest.raises(ValidationError, match="both low_risk and high_stakes"):
        ToolPolicy(gated=True, approvers=("a@example.com",), high_stakes=True, low_risk=True)


def confirm_record(field: str | None, **args: Any) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id="r-a0",
        run_id="r",
        tenant="default",
        index=0,
        tool="t",
        args=args,
        digest="0123456789abcdef" * 4,
        summary="s",
        why="",
        policy="p",
        requester="q@example.com",
        approvers=["a@example.com"],
        active_slots=[0],
        nonces=["n"],
        requested_at=0,
        round_started_at=0,
        deadline=1,
        confirm_field=field,
    )


def test_typed_confirmation_matches_what_will_run() -> None:
    amount = confirm_record("amount_usd", amount_usd="1500.00")
    assert confirm.expected(amount) == "1500.00" and confirm.label(amount) == "amount usd"
    for typed in ("1500.00", "1500", " $1,500.0 ", "1500.000"):
        assert confirm.matches(typed, "1500.00"), typed
    for typed in ("", "1500.01", "150", "1500.00x", "abc", "-1500", "1.5e3", "NaN"):
        assert not confirm.matches(typed, "1500.00"), typed
    assert confirm.expected(amount, {"amount_usd": "900.00"}) == "900.00", "the edited amount is what runs"
    customer = confirm_record("customer_id", customer_id="c_31")
    assert confirm.matches("C_31", confirm.expected(customer) or "") and not confirm.matches("c_3", "c_31")
    assert confirm.expected(confirm_record("fingerprint")) == "0123456789ab"
    assert confirm.expected(confirm_record(None)) is None
    assert "1500" not in confirm.REFUSAL, "the refusal names no value (error text is not encrypted)"


# -- email addresses (requesters, reassignment targets, policy approvers) ---------------------------

GOOD_ADDRESSES = [
    "alice@example.com",
    "Carol.Smith@Example.COM",
    "finance-lead@example.com",
    "first.last+approvals@mail.example.co.uk",
    "a_b%c@sub-domain.example.org",
    "x@y.io",
]
BAD_ADDRESSES = [
    "alice@example.com,mallory@evil.example",
    "alice,mallory@example.com",
    "ali\u200bce@example.com",  # zero-width space
    "alice\u2060@example.com",  # word joiner
    "alice\u202e@example.com",  # right-to-left override
    "\ufeffalice@example.com",  # byte-order mark
    "ali\x00ce@example.com",
    "ali\x07ce@example.com",
    "ali\x7fce@example.com",
    "alice@example.com\n",
    "alice@example.com\r\nBcc: mallory@evil.example",
    "al ice@example.com",
    '"alice"@example.com',
    "<alice@example.com>",
    "alice;mallory@example.com",
    "alicé@example.com",
    "alice@exämple.com",
    "alice@example",
    "@example.com",
]


@pytest.mark.parametrize("address", GOOD_ADDRESSES)
def test_ordinary_addresses_are_accepted_everywhere(address: str) -> None:
    assert AgentTask(goal="g", requester=address).requester == address
    assert ReassignRequest(approval_id="r-a0", to=address, replacing=address).to == address
    assert ToolPolicy(gated=True, approvers=(address,)).approvers == (address.lower(),)


@pytest.mark.parametrize("address", BAD_ADDRESSES, ids=repr)
def test_commas_control_and_invisible_characters_are_refused_everywhere(address: str) -> None:
    with pytest.raises(ValidationError):
        AgentTask(goal="g", requester=address)
    with pytest.raises(ValidationError):
        ReassignRequest(approval_id="r-a0", to=address)
    with pytest.raises(ValidationError):
        ReassignRequest(approval_id="r-a0", to="carol@example.com", replacing=address)
    with pytest.raises(ValidationError, match="is not an email address"):
        ToolPolicy(gated=True, approvers=("ops@example.com", address))


def test_the_demo_policies_approvers_stay_valid() -> None:
    for tool in default_registry():
        for approver in (*tool.policy.approvers, *tool.policy.escalate_to):
            assert re.fullmatch(EMAIL_PATTERN, approver), (tool.name, approver)


@pytest.mark.parametrize("run_id", ["run-1\n", "run-1\n\n", "run-1\r"], ids=repr)
def test_a_run_id_with_a_trailing_line_break_places_no_approval(run_id: str) -> None:
    """Python's `$` also matches before a final newline: the run id check anchors at the very end,
    so every caller that places an approval (the gate's calls, an agent run) refuses such an id."""
    assert links.placement_problem(run_id.rstrip(), 0) is None
    assert links.placement_problem(run_id, 0) == (
        f"run_id {run_id!r} must be 1-{links.MAX_RUN_ID} characters of A-Z a-z 0-9 . _ : -, the first a letter or digit"
    )
    with pytest.raises(ModelUnavailable):
        parse_model_id(f"openai:gpt-4.1{run_id.removeprefix('run-1')}")
