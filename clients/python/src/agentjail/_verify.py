"""Offline verification of agentjail run receipts: the checks of `agentjail receipt verify`.

This module needs nothing but the standard library and `cryptography`, and imports nothing
from the rest of the package, so that `crates/verify/tests/receipt_verify.py` (the
third-party verifier the docs point to) can load it by its path without `httpx`.

The checks, in order (each failure raises :class:`VerificationError` with a one-line reason):

1. the envelope is at most 16 MiB of JSON, its ``payloadType`` is
   ``application/vnd.in-toto+json`` and its payload is base64;
2. an Ed25519 signature over the DSSE pre-authentication encoding (PAE) verifies with the
   public key (a signature naming another ``keyid`` is not tried; the key id is the sha256 of
   the raw public key, hex);
3. the payload is an in-toto Statement v1 whose ``predicateType`` is
   ``https://agentjail.dev/attestation/run/v1`` (a run, a session's cell) or
   ``https://agentjail.dev/attestation/live-cell/v1`` (a live session's cell, signed by the
   service: its subject is the cell's code, ``code.py``; it names no workspace);
4. each artifact's sha256 equals the digest of the one subject with its name (the subject's
   full name, else its last path component);
5. a log of the command's stdout or stderr hashes to the predicate's ``stdout.sha256`` /
   ``stderr.sha256``;
6. a workspace checkpoint hashes to the predicate's ``workspace.after``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://agentjail.dev/attestation/run/v1"
LIVE_CELL_PREDICATE_TYPE = "https://agentjail.dev/attestation/live-cell/v1"
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024

#: A file's content: its bytes, a binary file object, or a path (``str`` or ``os.PathLike``).
Content = Union[bytes, bytearray, memoryview, "os.PathLike[str]", str, IO[bytes]]
#: An artifact: a path (matched by its name), ``(name, content)``, or bytes (matched when the
#: receipt has exactly one subject).
ArtifactArg = Union[bytes, bytearray, "os.PathLike[str]", str, Tuple[str, Content]]
#: A receipt: the parsed envelope, its JSON bytes, or a path to it.
ReceiptArg = Union[Mapping[str, Any], bytes, bytearray, "os.PathLike[str]", str]
#: A public key: an ``Ed25519PublicKey``, PEM text or bytes, or a path to a PEM file.
KeyArg = Union[Ed25519PublicKey, bytes, "os.PathLike[str]", str]


class VerificationError(Exception):
    """A receipt did not verify; ``reason`` says which check failed, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class VerifiedReceipt:
    """A receipt whose signature and every given file verified."""

    #: The signed in-toto statement (``subject``, ``predicateType``, ``predicate``).
    statement: Dict[str, Any]
    #: The id of the key that signed it (sha256 of the raw Ed25519 public key, hex).
    keyid: str

    @property
    def predicate(self) -> Dict[str, Any]:
        """The run predicate: ``status``, ``exit_code``, ``request_id``, limits, digests…"""
        p = self.statement.get("predicate")
        return p if isinstance(p, dict) else {}

    @property
    def is_live_cell(self) -> bool:
        """A live session's cell (signed by the service; no workspace digest)."""
        return self.statement.get("predicateType") == LIVE_CELL_PREDICATE_TYPE

    @property
    def status(self) -> Optional[str]:
        """The run's status as signed (``ok``, ``exit_nonzero``, …): check it."""
        s = self.predicate.get("status")
        return s if isinstance(s, str) else None

    @property
    def subjects(self) -> List[Dict[str, Any]]:
        """The signed artifacts: ``[{name, digest: {sha256}}]``."""
        s = self.statement.get("subject")
        return [x for x in s if isinstance(x, dict)] if isinstance(s, list) else []


def b64decode(s: str) -> bytes:
    """DSSE allows standard or URL-safe base64, padded or not."""
    t = s.rstrip("=")
    t += "=" * (-len(t) % 4)
    try:
        return base64.b64decode(t, validate=True)
    except (ValueError, binascii.Error):
        return base64.b64decode(t, altchars=b"-_", validate=True)


def pae(payload_type: str, body: bytes) -> bytes:
    """The DSSE pre-authentication encoding that is signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def keyid_of(key: Ed25519PublicKey) -> str:
    """The key id agentjail gives a public key: the sha256 of its 32 raw bytes, hex."""
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def _read(content: Content) -> bytes:
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    if isinstance(content, (str, os.PathLike)):
        with open(content, "rb") as f:
            return f.read()
    data = content.read()
    if not isinstance(data, bytes):
        raise TypeError("a file object given as content must be opened in binary mode")
    return data


def _sha256_hex(content: Content) -> str:
    if isinstance(content, (str, os.PathLike)):
        h = hashlib.sha256()
        with open(content, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                h.update(chunk)
        return h.hexdigest()
    return hashlib.sha256(_read(content)).hexdigest()


def load_public_key(public_key: KeyArg) -> Ed25519PublicKey:
    """An Ed25519 public key from a key object, PEM text or bytes, or a PEM file's path."""
    if isinstance(public_key, Ed25519PublicKey):
        return public_key
    if isinstance(public_key, bytes):
        pem = public_key
    elif isinstance(public_key, str) and "-----BEGIN" in public_key:
        pem = public_key.encode()
    else:
        with open(public_key, "rb") as f:
            pem = f.read()
    try:
        key = load_pem_public_key(pem.strip())
    except ValueError:
        raise VerificationError("the public key is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise VerificationError("the public key is not an Ed25519 key")
    return key


def _envelope(receipt: ReceiptArg) -> Dict[str, Any]:
    if isinstance(receipt, Mapping):
        return dict(receipt)
    raw = bytes(receipt) if isinstance(receipt, (bytes, bytearray)) else _read(receipt)
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise VerificationError("the envelope is larger than %d bytes" % MAX_ENVELOPE_BYTES)
    try:
        env = json.loads(raw)
    except ValueError:
        raise VerificationError("the envelope is not valid JSON") from None
    if not isinstance(env, dict):
        raise VerificationError("the envelope is not a JSON object")
    return env


def _authentic_payload(env: Mapping[str, Any], key: Ed25519PublicKey) -> Tuple[bytes, str]:
    payload_type = env.get("payloadType")
    if payload_type != PAYLOAD_TYPE:
        raise VerificationError("wrong payloadType %r" % (payload_type,))
    payload = env.get("payload")
    if not isinstance(payload, str):
        raise VerificationError("the envelope has no payload")
    try:
        body = b64decode(payload)
    except (ValueError, binascii.Error):
        raise VerificationError("the payload is not base64") from None
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError("the envelope has no signature")
    keyid = keyid_of(key)
    message = pae(PAYLOAD_TYPE, body)
    others = []
    for sig in sigs:
        if not isinstance(sig, dict):
            continue
        sig_keyid = sig.get("keyid") or ""
        if sig_keyid and sig_keyid != keyid:
            others.append(str(sig_keyid)[:80])
            continue
        try:
            key.verify(b64decode(str(sig.get("sig", ""))), message)
            return body, keyid
        except (InvalidSignature, ValueError, binascii.Error):
            continue
    if others and len(others) == len(sigs):
        raise VerificationError(
            "no signature verifies with this public key: the receipt is signed by key %s, "
            "this key is %s" % (others[0], keyid)
        )
    raise VerificationError("no signature verifies with this public key (key %s)" % keyid)


def _statement(body: bytes) -> Dict[str, Any]:
    try:
        statement = json.loads(body)
    except ValueError:
        raise VerificationError("the payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError("not an in-toto Statement v1")
    if statement.get("predicateType") not in (PREDICATE_TYPE, LIVE_CELL_PREDICATE_TYPE):
        raise VerificationError("not an agentjail run or live-cell predicate")
    if not isinstance(statement.get("subject", []), list):
        raise VerificationError("the statement's subject is not a list")
    if not isinstance(statement.get("predicate"), dict):
        raise VerificationError("the statement has no predicate")
    return statement


def _check_artifact(subjects: Sequence[Mapping[str, Any]], artifact: ArtifactArg) -> None:
    if isinstance(artifact, tuple):
        name, content = artifact
    elif isinstance(artifact, (bytes, bytearray)):
        if len(subjects) != 1:
            raise VerificationError(
                "an artifact given as bytes needs a name: the receipt has %d subjects"
                % len(subjects)
            )
        name, content = str(subjects[0].get("name", "")), bytes(artifact)
    else:
        name, content = os.fspath(artifact), artifact
    base = name.rsplit("/", 1)[-1]
    matches = [s for s in subjects if s.get("name") == name] or [
        s for s in subjects if str(s.get("name", "")).rsplit("/", 1)[-1] == base
    ]
    if len(matches) != 1:
        raise VerificationError("artifact %s is not (exactly one) subject of the receipt" % name)
    digest = matches[0].get("digest")
    signed = digest.get("sha256") if isinstance(digest, dict) else None
    if not isinstance(signed, str) or signed.lower() != _sha256_hex(content):
        raise VerificationError("artifact %s does not match the receipt" % name)


def _check_digest(predicate: Mapping[str, Any], which: str, content: Content) -> None:
    if which == "workspace":
        section, field, what = predicate.get("workspace"), "after", "workspace checkpoint"
    else:
        section, field, what = predicate.get(which), "sha256", which + " log"
    signed = section.get(field) if isinstance(section, dict) else None
    if not isinstance(signed, str) or not signed.startswith("sha256:"):
        raise VerificationError("the receipt carries no digest of the " + what)
    name = os.fspath(content) if isinstance(content, (str, os.PathLike)) else "(bytes)"
    if "sha256:" + _sha256_hex(content) != signed.lower():
        raise VerificationError("%s %s does not match the receipt" % (what, name))


def verify(
    receipt: ReceiptArg,
    artifact: Union[ArtifactArg, Sequence[ArtifactArg], None] = None,
    *,
    public_key: KeyArg,
    stdout: Optional[Content] = None,
    stderr: Optional[Content] = None,
    workspace: Optional[Content] = None,
    live_cell: bool = False,
) -> VerifiedReceipt:
    """Verifies a run receipt offline, as ``agentjail receipt verify`` does.

    ``receipt`` is the DSSE envelope (a dict, its JSON bytes, or a path). ``artifact`` is one
    artifact or a list of them: a path (matched to the subject of its name, e.g.
    ``summary.json``), a ``(name, content)`` pair, or bytes (when the receipt has one
    subject). ``public_key`` is the service's Ed25519 public key (PEM text or bytes, a path,
    or a key object: ``agentjail receipt pubkey`` prints it). ``stdout``, ``stderr`` and
    ``workspace`` are a log or a workspace checkpoint (bytes, a binary file object, or a
    path) checked against the digests the receipt signs.

    A live session's cell receipt (signed by the service; its subject is the cell's code,
    ``code.py``) is refused unless ``live_cell`` is true: it is not a run's receipt, and a
    file a run wrote could share its subject's name.

    Returns the :class:`VerifiedReceipt`; raises :class:`VerificationError` with the reason
    otherwise. A verified receipt says what happened, not that it went well: check
    ``status``.
    """
    key = load_public_key(public_key)
    body, keyid = _authentic_payload(_envelope(receipt), key)
    statement = _statement(body)
    if statement.get("predicateType") == LIVE_CELL_PREDICATE_TYPE and not live_cell:
        raise VerificationError(
            "a live session's cell receipt, not a run's: pass live_cell=True to accept one"
        )
    subjects = [s for s in statement.get("subject", []) if isinstance(s, dict)]
    if artifact is None:
        artifacts: Sequence[ArtifactArg] = []
    elif isinstance(artifact, list):
        artifacts = artifact
    else:
        artifacts = [artifact]  # type: ignore[list-item]
    for a in artifacts:
        _check_artifact(subjects, a)
    predicate = statement["predicate"]
    for which, content in (("stdout", stdout), ("stderr", stderr), ("workspace", workspace)):
        if content is not None:
            _check_digest(predicate, which, content)
    return VerifiedReceipt(statement=statement, keyid=keyid)


# ---------------------------------------------------------------------------------------------
# Sessions: the receipt chain


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical JSON of ``value``: object members sorted by their UTF-16
    code units, no whitespace, strings escaped minimally, numbers as ECMAScript prints them."""
    return _jcs(value).encode("utf-8")


def _jcs(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("RFC 8785 has no form for %r" % v)
        if v.is_integer() and abs(v) < 1e21:
            return str(int(v))
        r = repr(v)  # the shortest digits that round-trip, as ECMAScript's
        if "e" in r:
            mant, exp = r.split("e")
            e = int(exp)
            if -7 < e < 0:  # ECMAScript writes 1e-6 ..< 1e-4 in full; Python does not
                sign, digits = ("-", mant[1:]) if mant.startswith("-") else ("", mant)
                return "%s0.%s%s" % (sign, "0" * (-e - 1), digits.replace(".", ""))
            r = "%se%s%d" % (mant, "+" if e > 0 else "-", abs(e))
        return r
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_jcs(x) for x in v) + "]"
    if isinstance(v, Mapping):
        items = sorted(v.items(), key=lambda kv: str(kv[0]).encode("utf-16-be"))
        return "{" + ",".join(_jcs(str(k)) + ":" + _jcs(x) for k, x in items) + "}"
    raise ValueError("RFC 8785: cannot canonicalise a %s" % type(v).__name__)


def receipt_digest(receipt: ReceiptArg) -> str:
    """``sha256:`` over the RFC 8785 canonical JSON of a receipt (its DSSE envelope, as
    ``GET /v1/runs/{request_id}/receipt`` returns it): what the next cell's receipt names as
    ``predicate.session.previous_receipt_sha256``."""
    return "sha256:" + hashlib.sha256(canonical_json(_envelope(receipt))).hexdigest()


def verify_session(
    receipts: Sequence[Optional[ReceiptArg]],
    *,
    public_key: KeyArg,
    session_id: Optional[str] = None,
    previous: Optional[str] = None,
) -> List[VerifiedReceipt]:
    """Verifies a session's receipt chain offline: ``receipts`` are its cells' receipts in
    order (``None`` for a cell without one: it never started or could not be set up). Each
    receipt must verify on its own (:func:`verify`), name the session (``session_id``, or the
    first receipt's) and its own index, and name in ``previous_receipt_sha256`` the digest
    (:func:`receipt_digest`) of the latest earlier receipt; the first receipt names
    ``previous`` (``None`` for a session that was not forked; a fork's first cell names the
    receipt of the cell it was forked from). Returns the verified receipts (those present);
    raises :class:`VerificationError` at the first broken link."""
    out: List[VerifiedReceipt] = []
    expected_previous = previous
    for index, receipt in enumerate(receipts):
        if receipt is None:
            continue
        v = verify(receipt, public_key=public_key, live_cell=True)
        s = v.predicate.get("session")
        if not isinstance(s, dict):
            raise VerificationError("cell %d: the receipt names no session" % index)
        if session_id is None:
            session_id = str(s.get("id"))
        if s.get("id") != session_id:
            raise VerificationError(
                "cell %d: the receipt names session %r, not %r" % (index, s.get("id"), session_id)
            )
        if s.get("cell") != index:
            raise VerificationError("cell %d: the receipt names cell %r" % (index, s.get("cell")))
        if s.get("previous_receipt_sha256") != expected_previous:
            raise VerificationError(
                "cell %d: the receipt names the previous receipt %r, expected %r"
                % (index, s.get("previous_receipt_sha256"), expected_previous)
            )
        expected_previous = receipt_digest(receipt)
        out.append(v)
    return out
