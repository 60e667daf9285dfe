"""Unit tests of the link tokens: the tamper matrix, tenant subkeys, rotation, CSRF, and fuzzing.

A token is `v1.<kid>.<b64(run~index~slot~round~exp)>.<b64(seal + binding)>`: the seal covers the
token alone (so a page can tell a link of ours before its record exists), the binding also covers
the record (tenant, approval, approver, round nonce, digest). Every change to either must be refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.records import approval_record

from countersign.contract import ApprovalRecord
from countersign.security import links

SECRET_1 = b"1" * 32
SECRET_0 = b"0" * 32
KEYS = {"k1": SECRET_1, "k0": SECRET_0}
NOW = 1500.0


def record(**changes: object) -> ApprovalRecord:
    return approval_record(**{"tenant": "acme", **changes})


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def with_body(token: str, **fields: object) -> str:
    """The token with some body fields changed and its tag kept."""
    version, kid, body, tag = token.split(".")
    run, index, slot, round_, exp = unb64(body).decode().split("~")
    values = {"run": run, "index": index, "slot": slot, "round": round_, "exp": exp, **fields}
    changed = "~".join(str(values[k]) for k in ("run", "index", "slot", "round", "exp"))
    return ".".join([version, kid, b64(changed.encode()), tag])


def refused(token: str, rec: ApprovalRecord | None = None, keys: dict[str, bytes] | None = None) -> bool:
    try:
        links.check(token, rec or record(), keys or KEYS, NOW)
    except links.LinkInvalid:
        return True
    return False


TOKEN = links.mint(record(), 1, KEYS, "k1")


def binding(secret: bytes = SECRET_1) -> bytes:
    """TOKEN's binding to its record, computed here from its definition: HMAC-SHA256 under the tenant
    subkey over the canonical JSON of the token's fields and the record's."""
    subkey = hmac.new(secret, b"countersign.tenant-key.v1\x00acme", hashlib.sha256).digest()
    assert links.tenant_key(secret, "acme") == subkey
    message = {
        "v": "v1",
        "kid": "k1",
        "tenant": "acme",
        "run": "run-1",
        "approval": "run-1-a2",
        "index": 2,
        "approver": "b@example.com",
        "slot": 1,
        "round": 1,
        "nonce": "n1",
        "digest": "d" * 64,
        "exp": 2000,
    }
    canonical = json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(subkey, b"countersign.approval-link.v1\x00" + canonical, hashlib.sha256).digest()


def test_the_tag_is_a_seal_of_the_token_then_a_binding_to_the_record_under_the_tenant_subkey() -> None:
    head = f"v1.k1.{b64(b'run-1~2~1~1~2000')}"
    seal = hmac.new(SECRET_1, b"countersign.approval-link-seal.v1\x00" + head.encode(), hashlib.sha256).digest()
    assert f"{head}.{b64(seal[:16] + binding()[:16])}" == TOKEN
    assert links.check(TOKEN, record(), KEYS, NOW)[1] == "valid"
    assert "@" not in TOKEN and "acme" not in TOKEN and "d" * 12 not in TOKEN, "no personal data, no record values"


def test_a_token_is_sealed_by_our_keys_whatever_its_record() -> None:
    """What a page can tell before the record is saved: this token was made with one of our keys."""
    assert links.sealed(TOKEN, KEYS) and links.sealed(TOKEN, {"k1": SECRET_1})
    assert links.sealed(links.mint(record(tenant="globex", digest="e" * 64), 1, KEYS, "k0"), KEYS)
    version, kid, body, tag = TOKEN.split(".")
    assert not links.sealed(TOKEN, {"k1": SECRET_0}), "same kid, other secret"
    assert not links.sealed(TOKEN, {"k0": SECRET_0}), "its key removed"
    assert not links.sealed(".".join([version, kid, body, b64(b"\x00" * 16 + unb64(tag)[16:])]), KEYS)
    assert not links.sealed(with_body(TOKEN, index=3), KEYS), "its fields changed"
    assert not links.sealed(".".join([version, "k0", body, tag]), KEYS), "another key's id"
    assert not links.sealed("v1.k1.cnVuLTF-Mn4xfjF-MjAwMA." + "A" * 43, KEYS)
    assert not links.sealed("garbage", KEYS) and not links.sealed("", KEYS)
    assert refused(".".join([version, kid, body, b64(unb64(tag)[:16] + b"\x00" * 16)])), "a seal alone decides nothing"


def test_a_link_minted_before_seals_is_still_valid_but_not_sealed() -> None:
    """Links already in inboxes carry the whole binding as their tag: still valid against their record
    (their approvals may wait for days), but not sealed, so they get no wait for a missing record."""
    version, kid, body, _ = TOKEN.split(".")
    older = ".".join([version, kid, body, b64(binding())])
    assert links.check(older, record(), KEYS, NOW)[1] == "valid"
    assert refused(older, record(digest="e" * 64)) and refused(older, record(tenant="globex"))
    assert refused(older, record(), {"k1": SECRET_0}) and refused(
        ".".join([version, kid, body, b64(binding(SECRET_0))])
    )
    assert not links.sealed(older, KEYS)


@pytest.mark.parametrize(
    "fields",
    [{"run": "run-2"}, {"index": 3}, {"index": 1}, {"slot": 0}, {"round": 2}, {"exp": 2001}, {"exp": 1999}],
    ids=["run", "index+1", "index-1", "other-slot", "round+1", "exp+1", "exp-1"],
)
def test_every_token_field_is_bound(fields: dict[str, object]) -> None:
    assert refused(with_body(TOKEN, **fields))


@pytest.mark.parametrize(
    "changes",
    [
        {"tenant": "globex"},
        {"approval_id": "run-1-a3"},
        {"run_id": "run-2", "approval_id": "run-2-a2"},
        {"approvers": ["a@example.com", "mallory@example.com"]},
        {"nonces": ["n2"]},
        {"digest": "e" * 64},
        {"deadline": 2100.0},
    ],
    ids=["tenant", "approval", "run", "approver", "round-nonce", "digest", "deadline"],
)
def test_every_record_field_is_bound(changes: dict[str, object]) -> None:
    assert refused(TOKEN, record(**changes))


@pytest.mark.parametrize(
    "fields",
    [{"index": "02"}, {"slot": "01"}, {"slot": "001"}, {"round": "01"}, {"exp": "02000"}],
    ids=["index", "slot", "slot-twice", "round", "exp"],
)
def test_a_number_with_a_leading_zero_is_refused(fields: dict[str, object]) -> None:
    """The tag covers the numbers, not their spelling: `~01~` would verify like `~1~`, giving one
    approval several valid token strings (and so several idempotency keys)."""
    spelled = with_body(TOKEN, **fields)
    with pytest.raises(links.LinkInvalid) as caught:
        links.check(spelled, record(), KEYS, NOW)
    assert caught.value.status == 400
    zero_slot = links.mint(record(), 0, KEYS, "k1")
    assert links.check(zero_slot, record(), KEYS, NOW)[1] == "valid", "a plain 0 is the canonical zero"
    assert refused(with_body(zero_slot, slot="00"))


def test_another_tenants_token_is_refused_even_with_the_shared_secret() -> None:
    globex = record(tenant="globex")
    theirs = links.mint(globex, 1, KEYS, "k1")
    assert links.check(theirs, globex, KEYS, NOW)[1] == "valid"
    assert refused(theirs, record()) and refused(TOKEN, globex)
    assert links.tenant_key(SECRET_1, "acme") != links.tenant_key(SECRET_1, "globex")


def test_kid_version_and_part_structure() -> None:
    version, kid, body, tag = TOKEN.split(".")
    assert refused(".".join([version, "k0", body, tag])), "the other key's id"
    assert refused(".".join([version, "k9", body, tag])), "an unknown key id"
    for bad in (
        TOKEN.replace("v1.", "v2.", 1),
        TOKEN.replace("v1.", "V1.", 1),
        ".".join([version, kid, body]),
        TOKEN + ".x",
        ".".join([version, "", body, tag]),
        ".".join([version, "k-1", body, tag]),
        ".".join([version, kid, body + "=", tag]),
        ".".join([version, kid, body, tag + "=="]),
        ".".join([version, kid, body, tag[:-1]]),
        ".".join([version, kid, body, tag + "AA"]),
        TOKEN + " ",
        "",
        "v1...",
        "x" * 401,
    ):
        with pytest.raises(links.LinkInvalid) as caught:
            links.check(bad, record(), KEYS, NOW)
        assert caught.value.status in (400, 403) and (not bad or bad not in caught.value.reason)


def test_only_the_canonical_base64_spelling_is_accepted() -> None:
    version, kid, body, tag = TOKEN.split(".")
    # 32 bytes are 43 base64 characters; the last one carries 2 unused bits, so 3 other
    # characters decode to the same tag bytes. Each of them must be refused.
    aliases = [
        tag[:-1] + c
        for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        if c != tag[-1] and unb64(tag[:-1] + c) == unb64(tag)
    ]
    assert len(aliases) == 3
    for alias in aliases:
        assert refused(".".join([version, kid, body, alias]))


def test_every_byte_flip_deletion_and_insertion_is_refused() -> None:
    for i, ch in enumerate(TOKEN):
        assert refused(TOKEN[:i] + ("A" if ch != "A" else "B") + TOKEN[i + 1 :]), f"flip at {i}"
        assert refused(TOKEN[:i] + TOKEN[i + 1 :]), f"deletion at {i}"
        assert refused(TOKEN[:i] + "A" + TOKEN[i:]), f"insertion at {i}"
    for length in range(len(TOKEN)):
        assert refused(TOKEN[:length]), f"truncation to {length}"


def test_expiry_boundary() -> None:
    assert links.check(TOKEN, record(), KEYS, now=1999.999)[1] == "valid"
    assert links.check(TOKEN, record(), KEYS, now=2000)[1] == "expired"
    assert links.check(TOKEN, record(), KEYS, now=10**9)[1] == "expired"


def test_wrong_round_and_older_rounds() -> None:
    second = record(round=2, nonces=["n1", "n2"])
    assert links.check(TOKEN, second, KEYS, NOW)[1] == "replaced", "authentic, but a newer round exists"
    newer = links.mint(second, 1, KEYS, "k1")
    assert links.check(newer, second, KEYS, NOW)[1] == "valid"
    assert refused(newer, record()), "a round the record has not reached"
    assert refused(newer, record(round=2, nonces=["n1", "other"])), "that round's nonce"
    handed_on = record(active_slots=[0])
    assert refused(links.mint(handed_on, 1, KEYS, "k1"), handed_on), "a slot no longer asked"


def test_rotation_first_key_signs_all_verify_until_removed() -> None:
    old = links.mint(record(), 1, {"k0": SECRET_0}, "k0")
    rotated = {"k1": SECRET_1, "k0": SECRET_0}
    assert links.check(old, record(), rotated, NOW)[1] == "valid", "an older key verifies until removed"
    assert refused(old, record(), {"k1": SECRET_1}), "rotated out"
    assert refused(TOKEN, record(), {"k1": SECRET_0}), "same kid, other secret"


def test_csrf_is_bound_to_the_link_and_rotates_with_the_keys() -> None:
    csrf = links.csrf_token(TOKEN, KEYS, "k1")
    other = links.mint(record(), 0, KEYS, "k1")
    assert links.csrf_ok(TOKEN, csrf, KEYS)
    assert not links.csrf_ok(other, csrf, KEYS)
    assert not links.csrf_ok(TOKEN, csrf[:-1], KEYS) and not links.csrf_ok(TOKEN, "", KEYS)
    assert not links.csrf_ok(TOKEN, "\x80é" + csrf, KEYS), "non-ASCII input is refused, not a crash (found by fuzzing)"
    assert not links.csrf_ok(TOKEN, csrf, {"k0": SECRET_0}), "the key that made it was removed"
    assert links.csrf_ok(TOKEN, links.csrf_token(TOKEN, KEYS, "k0"), KEYS)


# --------------------------------------------------------------------------------------------------
# Property-based: whatever arrives in the URL, the answer is a refusal with a 4xx, never a crash.

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
token_alphabet = st.sampled_from("v1.k0Aa_-~=+/%\x00é" + "".join(chr(c) for c in range(33, 127)))


@FUZZ
@given(st.text(max_size=500))
@example("v1.k1.." + "A" * 43)
@example("v1.k1.cnVuLTF-Mn4xfjF-MjAwMA." + "A" * 43)
@example("v1.k1.cnVuLTF-wrJ-MX4xfjIwMDA." + "A" * 43)
def test_any_text_is_refused_with_a_4xx(text: str) -> None:
    with pytest.raises(links.LinkInvalid) as caught:
        links.check(text, record(), KEYS, NOW)
    assert caught.value.status in (400, 403)


@FUZZ
@given(st.lists(token_alphabet, max_size=200).map("".join))
def test_token_shaped_text_is_refused(text: str) -> None:
    assert refused("v1.k1." + text)


@FUZZ
@given(
    run=st.from_regex(links.RUN_ID, fullmatch=True),
    numbers=st.lists(st.integers(min_value=0, max_value=10**12 - 1), min_size=4, max_size=4),
    tag=st.binary(min_size=32, max_size=32),
    kid=st.sampled_from(["k1", "k0"]),
)
def test_well_formed_tokens_with_a_forged_tag_are_refused(run: str, numbers: list[int], tag: bytes, kid: str) -> None:
    body = "~".join([run, *map(str, numbers)]).encode()
    forged = f"v1.{kid}.{b64(body)}.{b64(tag)}"
    claims = links.parse(forged)
    assert (claims.run_id, [claims.index, claims.slot, claims.round, claims.exp]) == (run, numbers)
    assert refused(forged)


@FUZZ
@given(st.data())
def test_random_edits_of_a_valid_token_are_refused(data: st.DataObject) -> None:
    token = TOKEN
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(token)))
        op = data.draw(st.sampled_from(["replace", "delete", "insert"]))
        ch = data.draw(token_alphabet)
        if op == "replace" and i < len(token):
            token = token[:i] + ch + token[i + 1 :]
        elif op == "delete":
            token = token[:i] + token[i + 1 :]
        else:
            token = token[:i] + ch + token[i:]
    if token != TOKEN:
        assert refused(token)


def test_inbox_tokens_carry_when_they_were_made() -> None:
    made = links.inbox_token("b@example.com", KEYS, "k1", 2000, issued_ms=1_234_567)
    assert links.inbox_claims(made, KEYS, NOW) == links.InboxClaims("b@example.com", 1_234_567, 2000)
    assert links.check_inbox_token(made, KEYS, NOW) == "b@example.com"
    version, kid, body, tag = made.split(".")
    later = b64(unb64(body).replace(b"~1234567~", b"~9234567~"))
    with pytest.raises(links.LinkInvalid):
        links.inbox_claims(".".join([version, kid, later, tag]), KEYS, NOW)  # the issue time is signed
    # A link made before tokens carried it (`approver~exp`) still opens, dated to the start of its 30 days.
    old_body = b"b@example.com~2000"
    old_tag = hmac.new(SECRET_1, b"countersign.inbox.v1\x00" + old_body, hashlib.sha256).digest()
    old = f"v1.k1.{b64(old_body)}.{b64(old_tag)}"
    assert links.inbox_claims(old, KEYS, NOW).issued_ms == (2000 - links.INBOX_LINK_DAYS * 86400) * 1000
    with pytest.raises(links.LinkInvalid) as caught:
        links.inbox_claims(made, KEYS, 2000)
    assert caught.value.status == 410
