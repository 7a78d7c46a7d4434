#!/usr/bin/env python3
"""Verify an agentjail run receipt without agentjail.

Usage: receipt_verify.py RECEIPT PUBKEY_PEM [ARTIFACT...] [--stdout LOG] [--stderr LOG] [--live-cell]
       [--workspace CHECKPOINT]

A command line over the Python client's offline verifier,
clients/python/src/agentjail/_verify.py (`agentjail.verify`), loaded by its path: it needs
nothing but Python 3 and the `cryptography` package (not the client's `httpx`). The checks
(the module's docstring lists them) are those of `agentjail receipt verify`: the DSSE payload
type, an Ed25519 signature over the PAE with PUBKEY_PEM (the output of `agentjail receipt
pubkey`), an in-toto Statement v1 with the agentjail run predicate, each ARTIFACT against the
subject of its name, a stdout/stderr LOG against the predicate's digest of that stream, and a
workspace CHECKPOINT against `predicate.workspace.after`.
Prints the verified subjects and the run's status; exits 1 with a one-line reason otherwise.
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.join(HERE, "..", "..", "..", "clients", "python", "src", "agentjail", "_verify.py")


def load_verifier():
    spec = importlib.util.spec_from_file_location("agentjail_verify_standalone", MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fail(reason):
    print("receipt NOT verified: " + reason, file=sys.stderr)
    sys.exit(1)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    receipt, pubkey, rest = argv[1], argv[2], argv[3:]
    artifacts, logs = [], {}
    while rest:
        a = rest.pop(0)
        if a == "--live-cell":
            logs["live_cell"] = True
        elif a in ("--stdout", "--stderr", "--workspace"):
            if not rest:
                fail(a + " needs a file")
            logs[a[2:]] = rest.pop(0)
        else:
            artifacts.append(a)
    v = load_verifier()
    try:
        r = v.verify(receipt, artifacts, public_key=pubkey, **logs)
    except v.VerificationError as e:
        fail(e.reason)
    print("receipt verified: status=%s exit_code=%s subjects=%s" % (
        r.predicate.get("status"), r.predicate.get("exit_code"),
        ",".join(s["name"] for s in r.subjects)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
