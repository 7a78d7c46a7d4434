#!/usr/bin/env python3
"""Signs and verifies agentjail's release provenance (docs/release.md).

The provenance is an in-toto Statement v1 (predicate: SLSA provenance v1) whose subjects are
the release artifacts by sha256, in a DSSE envelope signed with Ed25519: the same envelope,
payload type, canonical JSON and key id as agentjail's run receipts (docs/receipts.md), and the
same key format (a PKCS#8 PEM Ed25519 private key, e.g. an agentjail receipt key).

    provenance.py sign --key KEY.pem --out FILE --predicate PREDICATE.json ARTIFACT...
    provenance.py [verify] --pubkey PUB.pem FILE [ARTIFACT...]

Only the Python standard library and the `openssl` command (1.1.1 or later, for Ed25519) are
needed, so that a user can verify a download without installing anything. `verify` checks the
payload type, the signature over the DSSE pre-authentication encoding, the statement and
predicate types, and that every ARTIFACT given is a subject with the same sha256 (matched by
file name); it exits 0 and prints one line, or exits 1 naming what failed.
"""

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def canonical(value) -> bytes:
    """RFC 8785 canonical JSON for what the statement holds (ASCII keys, strings, integers)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def openssl(args, stdin_path=None) -> bytes:
    r = subprocess.run(["openssl", *args], capture_output=True)
    if r.returncode != 0:
        raise RuntimeError("openssl %s: %s" % (args[0], r.stderr.decode(errors="replace").strip()))
    return r.stdout


def raw_public_key(pub_pem_path: str) -> bytes:
    """The 32-byte Ed25519 public key of a PEM public key (the last 32 bytes of its DER)."""
    der = openssl(["pkey", "-pubin", "-in", pub_pem_path, "-outform", "DER"])
    if len(der) != 44 or not der.startswith(bytes.fromhex("302a300506032b6570032100")):
        raise RuntimeError("%s is not an Ed25519 public key" % pub_pem_path)
    return der[12:]


def sign(args) -> int:
    subjects = [
        {"name": os.path.basename(p), "digest": {"sha256": sha256_file(p)}} for p in args.artifacts
    ]
    with open(args.predicate, "rb") as f:
        predicate = json.load(f)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }
    body = canonical(statement)
    with tempfile.TemporaryDirectory(prefix="release-provenance-") as tmp:
        msg = os.path.join(tmp, "pae")
        pub = os.path.join(tmp, "pub.pem")
        with open(msg, "wb") as f:
            f.write(pae(PAYLOAD_TYPE, body))
        sig = openssl(["pkeyutl", "-sign", "-rawin", "-inkey", args.key, "-in", msg])
        openssl(["pkey", "-in", args.key, "-pubout", "-out", pub])
        keyid = hashlib.sha256(raw_public_key(pub)).hexdigest()
    envelope = {
        "payload": base64.b64encode(body).decode(),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": keyid, "sig": base64.b64encode(sig).decode()}],
    }
    with open(args.out, "w") as f:
        json.dump(envelope, f, indent=2)
        f.write("\n")
    return 0


def b64decode(s: str) -> bytes:
    """Standard or URL-safe base64, padded or not (as DSSE allows)."""
    s = s.rstrip("=")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        return base64.urlsafe_b64decode(s)


def verify(args) -> int:
    def fail(msg: str) -> int:
        print("provenance verification failed: %s" % msg, file=sys.stderr)
        return 1

    try:
        with open(args.envelope, "rb") as f:
            env = json.load(f)
        if env.get("payloadType") != PAYLOAD_TYPE:
            return fail("payloadType is %r, not %r" % (env.get("payloadType"), PAYLOAD_TYPE))
        body = b64decode(env["payload"])
        keyid = hashlib.sha256(raw_public_key(args.pubkey)).hexdigest()
        ok = False
        with tempfile.TemporaryDirectory(prefix="release-provenance-") as tmp:
            msg, sigf = os.path.join(tmp, "pae"), os.path.join(tmp, "sig")
            with open(msg, "wb") as f:
                f.write(pae(PAYLOAD_TYPE, body))
            for s in env.get("signatures", []):
                with open(sigf, "wb") as f:
                    f.write(b64decode(s.get("sig", "")))
                r = subprocess.run(
                    ["openssl", "pkeyutl", "-verify", "-rawin", "-pubin", "-inkey", args.pubkey,
                     "-in", msg, "-sigfile", sigf],
                    capture_output=True,
                )
                if r.returncode == 0:
                    ok = True
                    break
        if not ok:
            return fail("no signature verifies with key %s" % keyid)
        st = json.loads(body)
        if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
            return fail("not an in-toto Statement v1 with SLSA provenance v1")
        subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
        for a in args.artifacts:
            name = os.path.basename(a)
            if name not in subjects:
                return fail("%s is not a subject of the provenance" % name)
            got = sha256_file(a)
            if got != subjects[name]:
                return fail("%s does not match: sha256 %s, signed %s" % (name, got, subjects[name]))
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as e:
        return fail(str(e))
    commit = (
        st.get("predicate", {}).get("buildDefinition", {}).get("externalParameters", {})
        .get("commit", "?")
    )
    print(
        "provenance OK: signed by key %s; commit %s; %d subject(s); %d artifact(s) match"
        % (keyid, commit, len(subjects), len(args.artifacts))
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sign")
    s.add_argument("--key", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--predicate", required=True)
    s.add_argument("artifacts", nargs="+")
    v = sub.add_parser("verify")
    v.add_argument("--pubkey", required=True)
    v.add_argument("envelope")
    v.add_argument("artifacts", nargs="*")
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("sign", "verify", "-h", "--help"):
        argv = ["verify", *argv]  # `verify-provenance.py --pubkey KEY FILE ...`
    a = p.parse_args(argv)
    return sign(a) if a.cmd == "sign" else verify(a)


if __name__ == "__main__":
    sys.exit(main())
