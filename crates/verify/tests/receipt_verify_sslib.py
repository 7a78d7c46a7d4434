#!/usr/bin/env python3
"""Verify an agentjail receipt's DSSE signature with securesystemslib, the DSSE implementation
used by the in-toto Python tools (pip install 'securesystemslib[crypto]').

Usage: receipt_verify_sslib.py RECEIPT PUBKEY_PEM
"""

import hashlib
import json
import sys

from cryptography.hazmat.primitives.serialization import load_pem_public_key, Encoding, PublicFormat
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey


def main(argv):
    receipt_path, pubkey_path = argv[1], argv[2]
    with open(pubkey_path, "rb") as f:
        public = load_pem_public_key(f.read())
    # agentjail's key id: hex sha256 of the raw 32-byte Ed25519 public key.
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    key = SSlibKey.from_crypto(public, keyid=hashlib.sha256(raw).hexdigest())
    with open(receipt_path, "rb") as f:
        envelope = Envelope.from_dict(json.load(f))
    if envelope.payload_type != "application/vnd.in-toto+json":
        print("wrong payload type", file=sys.stderr)
        return 1
    try:
        envelope.verify([key], 1)
    except Exception as e:  # VerificationError
        print("receipt NOT verified: %s" % e, file=sys.stderr)
        return 1
    statement = json.loads(envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://agentjail.dev/attestation/run/v1"
    print("receipt verified by securesystemslib: %s" % statement["subject"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
