"""Restate request identity: only the Restate server holding the private key can invoke the endpoint.

The session stack runs protected (see support.processes): restate-server signs with its own key and
the app requires it. These tests call the endpoint directly, as an attacker on the network would.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.processes import DEPLOYMENT_PROTOCOLS, REPO, AppServer, RestateServer, free_port

from countersign.security import identity
from countersign.tools import DEMO_TOOLS

MANIFEST = {"accept": "application/vnd.restate.endpointmanifest.v3+json"}


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signed(key: Ed25519PrivateKey, kid: str, aud: str, *, expires_in: int = 60) -> dict[str, str]:
    """The headers restate-server sends: an EdDSA JWT over the request's path (`aud`)."""
    now = int(time.time())
    header = b64(json.dumps({"typ": "JWT", "alg": "EdDSA", "kid": kid}).encode())
    claims = b64(json.dumps({"aud": aud, "iat": now - 5, "nbf": now - 5, "exp": now + expires_in}).encode())
    signature = b64(key.sign(f"{header}.{claims}".encode()))
    return {"x-restate-signature-scheme": "v1", "x-restate-jwt-v1": f"{header}.{claims}.{signature}", **MANIFEST}


def server_key(restate: RestateServer) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(restate.env[identity.PRIVATE_KEY_ENV]).read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def test_restate_server_signs_with_the_key_id_we_compute(restate_server: RestateServer) -> None:
    logged = re.search(r'Loaded request identity key\s+kid: "(publickeyv1_\w+)"', restate_server.log_path.read_text())
    assert logged is not None, "restate-server did not load the identity key"
    assert logged.group(1) == restate_server.identity_key


def test_unsigned_or_forged_calls_to_the_endpoint_get_401(app_server: AppServer, restate_server: RestateServer) -> None:
    base = app_server.restate_uri
    kid, real, other = restate_server.identity_key, server_key(restate_server), Ed25519PrivateKey.generate()
    assert httpx.get(f"{base}/discover", headers=MANIFEST, timeout=10).status_code == 401
    invoke = httpx.post(
        f"{base}/invoke/AgentRun/run", content=b"\x00" * 8, headers={"content-type": "application/restate"}, timeout=10
    )
    assert invoke.status_code == 401
    refused = {
        "another key under the right kid": signed(other, kid, "/discover"),
        "expired": signed(real, kid, "/discover", expires_in=-10),
        "signed for another path": signed(real, kid, "/invoke/AgentRun/run"),
        "scheme unsigned": {"x-restate-signature-scheme": "unsigned", **MANIFEST},
    }
    for what, headers in refused.items():
        assert httpx.get(f"{base}/discover", headers=headers, timeout=10).status_code == 401, what
    # The same request signed with the server's own key is served: the harness above is faithful.
    discovered = httpx.get(f"{base}/discover", headers=signed(real, kid, "/discover"), timeout=10)
    assert discovered.status_code == 200 and "AgentRun" in discovered.text
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200, "health needs no signature"


def test_registration_and_invocations_through_the_server_work(
    app_server: AppServer, restate_server: RestateServer, deployment_protocol: str
) -> None:
    # Re-register with the session's own protocol: a forced re-registration replaces the deployment.
    answer = restate_server.register(app_server.restate_uri, http1=DEPLOYMENT_PROTOCOLS[deployment_protocol])
    assert "AgentRun" in json.dumps(answer)
    reply = httpx.post(f"{restate_server.ingress_url}/AgentRun/identity-probe/status", timeout=30)
    assert reply.status_code == 200


def test_an_app_expecting_another_key_refuses_this_server(restate_server: RestateServer, tmp_path: Path) -> None:
    stranger = identity.ensure_key_pair(tmp_path / "stranger.pem")
    port = free_port()
    env = {
        "COUNTERSIGN_ENV": "test",
        "COUNTERSIGN_TOOLS": DEMO_TOOLS,
        "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 32,
        "APPROVALS_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DEMO_DB": str(tmp_path / "b.db"),
        "RESTATE_IDENTITY_KEYS": stranger,
    }
    app = AppServer.start(env=env, port=port, log_path=tmp_path / "app.log")
    try:
        with pytest.raises(RuntimeError, match="401"):
            restate_server.register(app.restate_uri)
    finally:
        app.stop()


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RESTATE_", "COUNTERSIGN_", "APPROVALS_"))}
    return {
        **keep,
        "COUNTERSIGN_ENV": "production",
        "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 32,
        "APPROVALS_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DEMO_DB": str(tmp_path / "b.db"),
        **extra,
    }


@pytest.mark.parametrize("missing", ["RESTATE_IDENTITY_KEYS", "COUNTERSIGN_JOURNAL_KEYS"])
def test_serve_refuses_to_start_in_production_without_keys(tmp_path: Path, missing: str) -> None:
    keys = {
        "RESTATE_IDENTITY_KEYS": identity.ensure_key_pair(tmp_path / "id.pem"),
        "COUNTERSIGN_JOURNAL_KEYS": "j1:" + base64.b64encode(os.urandom(32)).decode(),
    }
    del keys[missing]
    done = subprocess.run(
        [sys.executable, "-m", "countersign", "serve", "--bind", f"127.0.0.1:{free_port()}"],
        cwd=REPO,
        env=serve_env(tmp_path, **keys),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert missing in done.stderr and "Traceback" not in done.stderr
