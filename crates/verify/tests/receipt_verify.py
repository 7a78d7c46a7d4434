#!/usr/bin/env python3
"""Verify an agentjail run receipt without agentjail.

Usage: receipt_verify.py RECEIPT PUBKEY_PEM [ARTIFACT...] [--stdout LOG] [--stderr LOG]
       [--workspace CHECKPOINT]

Checks, with nothing but the `cryptography` package:
  1. the DSSE envelope's payloadType is application/vnd.in-toto+json;
  2. an Ed25519 signature over the DSSE pre-authentication encoding (PAE) verifies with
     PUBKEY_PEM (the output of `agentjail receipt pubkey`);
  3. the payload is an in-toto Statement v1 with predicateType
     https://agentjail.dev/attestation/run/v1;
  4. each ARTIFACT's sha256 equals the digest of the subject with the same name (the subject's
     full name, or its last path component);
  5. a LOG of the command's stdout or stderr hashes to the `sha256` the predicate carries for
     that stream (`predicate.stdout.sha256`, `predicate.stderr.sha256`);
  6. a workspace CHECKPOINT (the tar `agentjail run --workspace-out` wrote) hashes to the
     digest the predicate names for the workspace after the run (`predicate.workspace.after`).
Prints the verified subjects and the run's status; exits 1 with a one-line reason otherwise.
"""

import base64
import hashlib
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://agentjail.dev/attestation/run/v1"


def b64decode(s):
    """DSSE allows standard or URL-safe base64, padded or not."""
    s = s.rstrip("=")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, altchars=None, validate=True)
    except ValueError:
        return base64.urlsafe_b64decode(s)


def pae(payload_type, body):
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def fail(reason):
    print("receipt NOT verified: " + reason, file=sys.stderr)
    sys.exit(1)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    receipt_path, pubkey_path, rest = argv[1], argv[2], argv[3:]
    artifacts, logs = [], []
    while rest:
        a = rest.pop(0)
        if a in ("--stdout", "--stderr", "--workspace"):
            if not rest:
                fail(a + " needs a file")
            logs.append((a[2:], rest.pop(0)))
        else:
            artifacts.append(a)

    with open(receipt_path, "rb") as f:
        envelope = json.load(f)
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        fail("wrong payloadType %r" % envelope.get("payloadType"))
    body = b64decode(envelope["payload"])

    with open(pubkey_path, "rb") as f:
        key = load_pem_public_key(f.read())
    if not isinstance(key, Ed25519PublicKey):
        fail("the public key is not an Ed25519 key")
    message = pae(envelope["payloadType"], body)
    for sig in envelope.get("signatures", []):
        try:
            key.verify(b64decode(sig["sig"]), message)
            break
        except (InvalidSignature, ValueError):
            continue
    else:
        fail("no signature verifies with this public key")

    statement = json.loads(body)
    if statement.get("_type") != STATEMENT_TYPE:
        fail("not an in-toto Statement v1")
    if statement.get("predicateType") != PREDICATE_TYPE:
        fail("not an agentjail run predicate")

    subjects = statement.get("subject", [])
    for path in artifacts:
        name = path.rsplit("/", 1)[-1]
        matches = [s for s in subjects if s["name"] == path] or [
            s for s in subjects if s["name"].rsplit("/", 1)[-1] == name
        ]
        if len(matches) != 1:
            fail("artifact %s is not (exactly one) subject of the receipt" % path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                h.update(chunk)
        if h.hexdigest() != matches[0]["digest"]["sha256"].lower():
            fail("artifact %s does not match the receipt" % path)

    pred = statement["predicate"]
    for stream, path in logs:
        if stream == "workspace":
            signed = (pred.get("workspace") or {}).get("after")
        else:
            signed = (pred.get(stream) or {}).get("sha256")
        what = "workspace checkpoint" if stream == "workspace" else stream + " log"
        if not signed or not signed.startswith("sha256:"):
            fail("the receipt carries no digest of the " + what)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                h.update(chunk)
        if "sha256:" + h.hexdigest() != signed.lower():
            fail("%s %s does not match the receipt" % (what, path))

    print("receipt verified: status=%s exit_code=%s subjects=%s" % (
        pred.get("status"), pred.get("exit_code"),
        ",".join(s["name"] for s in subjects)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
