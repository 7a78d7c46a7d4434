/**
 * Offline verification of agentjail run receipts: the checks of `agentjail receipt verify`
 * and of the Python client's `agentjail.verify`, with WebCrypto (Ed25519, SHA-256) only, so
 * that it runs in Node ≥ 20 and in browsers.
 *
 * The checks, in order (each failure throws {@link VerificationError} with a one-line reason):
 *
 * 1. the envelope is at most 16 MiB of JSON, its `payloadType` is
 *    `application/vnd.in-toto+json` and its payload is base64;
 * 2. an Ed25519 signature over the DSSE pre-authentication encoding (PAE) verifies with the
 *    public key (a signature naming another `keyid` is not tried; the key id is the sha256 of
 *    the raw public key, hex);
 * 3. the payload is an in-toto Statement v1 whose `predicateType` is
 *    `https://agentjail.dev/attestation/run/v1` (a run, a session's cell) or
 *    `https://agentjail.dev/attestation/live-cell/v1` (a live session's cell, signed by the
 *    service: its subject is the cell's code, `code.py`; it names no workspace);
 * 4. each artifact's sha256 equals the digest of the one subject with its name (the subject's
 *    full name, else its last path component);
 * 5. a log of the command's stdout or stderr hashes to the predicate's `stdout.sha256` /
 *    `stderr.sha256`;
 * 6. a workspace checkpoint hashes to the predicate's `workspace.after`.
 *
 * @packageDocumentation
 */

/** The DSSE payload type of a receipt's envelope. */
export const PAYLOAD_TYPE = "application/vnd.in-toto+json";
/** The in-toto statement type a receipt's payload carries. */
export const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
/** The predicate type of a run's receipt. */
export const PREDICATE_TYPE = "https://agentjail.dev/attestation/run/v1";
/** The predicate type of a live session's cell's receipt. */
export const LIVE_CELL_PREDICATE_TYPE = "https://agentjail.dev/attestation/live-cell/v1";
export const MAX_ENVELOPE_BYTES = 16 * 1024 * 1024;

/** A file's content: bytes, a Blob (or File), or text (encoded as UTF-8). */
export type Content = Uint8Array | ArrayBuffer | Blob | string;
/**
 * An artifact: a `File` (matched by its name), `{name, content}` or `[name, content]`, or
 * bare content (matched when the receipt has exactly one subject).
 */
export type ArtifactArg = Content | { name: string; content: Content } | readonly [string, Content];
/** A receipt: the parsed envelope, or its JSON as text, bytes or a Blob. */
export type ReceiptArg = Record<string, unknown> | string | Uint8Array | ArrayBuffer | Blob;
/** A public key: PEM text or bytes, or an Ed25519 `CryptoKey`. */
export type KeyArg = string | Uint8Array | CryptoKey;

/** A receipt did not verify; `reason` says which check failed, in one line. */
export class VerificationError extends Error {
  override name = "VerificationError";
  constructor(readonly reason: string) {
    super(reason);
  }
}

/** A receipt whose signature and every given file verified. */
export class VerifiedReceipt {
  constructor(
    /** The signed in-toto statement (`subject`, `predicateType`, `predicate`). */
    readonly statement: Record<string, unknown>,
    /** The id of the key that signed it (sha256 of the raw Ed25519 public key, hex). */
    readonly keyid: string,
  ) {}
  /** The run predicate: `status`, `exit_code`, `request_id`, limits, digests… */
  get predicate(): Record<string, any> {
    const p = this.statement["predicate"];
    return isObject(p) ? p : {};
  }
  /** A live session's cell (signed by the service; no workspace digest). */
  get isLiveCell(): boolean {
    return this.statement["predicateType"] === LIVE_CELL_PREDICATE_TYPE;
  }
  /** The run's status as signed (`ok`, `exit_nonzero`, …): check it. */
  get status(): string | undefined {
    const s = this.predicate["status"];
    return typeof s === "string" ? s : undefined;
  }
  /** The signed artifacts: `[{name, digest: {sha256}}]`. */
  get subjects(): Array<Record<string, any>> {
    const s = this.statement["subject"];
    return Array.isArray(s) ? s.filter(isObject) : [];
  }
}

function isObject(v: unknown): v is Record<string, any> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const subtle = (): SubtleCrypto => globalThis.crypto.subtle;
const utf8 = new TextEncoder();

/** DSSE allows standard or URL-safe base64, padded or not. */
export function b64decode(s: string): Uint8Array {
  let t = s.replace(/=+$/, "").replace(/-/g, "+").replace(/_/g, "/");
  if (!/^[A-Za-z0-9+/]*$/.test(t) || t.length % 4 === 1) throw new Error("not base64");
  t += "=".repeat((4 - (t.length % 4)) % 4);
  const bin = atob(t);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** The DSSE pre-authentication encoding that is signed. */
export function pae(payloadType: string, body: Uint8Array): Uint8Array {
  const t = utf8.encode(payloadType);
  return concat(utf8.encode(`DSSEv1 ${t.length} `), t, utf8.encode(` ${body.length} `), body);
}

function hex(b: ArrayBuffer): string {
  return Array.from(new Uint8Array(b), (x) => x.toString(16).padStart(2, "0")).join("");
}

async function bytesOf(content: Content): Promise<Uint8Array> {
  if (typeof content === "string") return utf8.encode(content);
  if (content instanceof Uint8Array) return content;
  if (content instanceof ArrayBuffer) return new Uint8Array(content);
  return new Uint8Array(await content.arrayBuffer());
}

/** The sha256 of some content, hex. */
export async function sha256Hex(content: Content): Promise<string> {
  return hex(await subtle().digest("SHA-256", (await bytesOf(content)) as BufferSource));
}

/** The key id agentjail gives a public key: the sha256 of its 32 raw bytes, hex. */
export async function keyidOf(key: CryptoKey): Promise<string> {
  return hex(await subtle().digest("SHA-256", await subtle().exportKey("raw", key)));
}

const ED25519_SPKI_PREFIX = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/** An Ed25519 public key from PEM text or bytes (or a `CryptoKey`, returned as it is). */
export async function loadPublicKey(publicKey: KeyArg): Promise<CryptoKey> {
  if (typeof publicKey !== "string" && !(publicKey instanceof Uint8Array)) return publicKey;
  const pem = typeof publicKey === "string" ? publicKey : new TextDecoder().decode(publicKey);
  const m = /-----BEGIN PUBLIC KEY-----([A-Za-z0-9+/=\s]+)-----END PUBLIC KEY-----/.exec(pem.trim());
  let der: Uint8Array;
  try {
    if (!m || !m[1]) throw new Error("no PEM");
    der = b64decode(m[1].replace(/\s+/g, ""));
    if (der.length < 2 || der[0] !== 0x30) throw new Error("not DER");
  } catch {
    throw new VerificationError("the public key is not a PEM public key");
  }
  if (der.length !== 44 || !ED25519_SPKI_PREFIX.every((b, i) => der[i] === b)) {
    throw new VerificationError("the public key is not an Ed25519 key");
  }
  return subtle().importKey("spki", der as BufferSource, { name: "Ed25519" }, true, ["verify"]);
}

async function envelope(receipt: ReceiptArg): Promise<Record<string, unknown>> {
  let raw: Uint8Array;
  if (typeof receipt === "string") raw = utf8.encode(receipt);
  else if (receipt instanceof Uint8Array || receipt instanceof ArrayBuffer || receipt instanceof Blob) {
    raw = await bytesOf(receipt);
  } else return { ...receipt };
  if (raw.length > MAX_ENVELOPE_BYTES) {
    throw new VerificationError(`the envelope is larger than ${MAX_ENVELOPE_BYTES} bytes`);
  }
  let env: unknown;
  try {
    env = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch {
    throw new VerificationError("the envelope is not valid JSON");
  }
  if (!isObject(env)) throw new VerificationError("the envelope is not a JSON object");
  return env;
}

const repr = (v: unknown): string => (v === undefined ? "null" : JSON.stringify(v));

async function authenticPayload(env: Record<string, unknown>, key: CryptoKey): Promise<[Uint8Array, string]> {
  const payloadType = env["payloadType"];
  if (payloadType !== PAYLOAD_TYPE) throw new VerificationError(`wrong payloadType ${repr(payloadType)}`);
  const payload = env["payload"];
  if (typeof payload !== "string") throw new VerificationError("the envelope has no payload");
  let body: Uint8Array;
  try {
    body = b64decode(payload);
  } catch {
    throw new VerificationError("the payload is not base64");
  }
  const sigs = env["signatures"];
  if (!Array.isArray(sigs) || sigs.length === 0) throw new VerificationError("the envelope has no signature");
  const keyid = await keyidOf(key);
  const message = pae(PAYLOAD_TYPE, body);
  const others: string[] = [];
  for (const sig of sigs) {
    if (!isObject(sig)) continue;
    const sigKeyid: unknown = sig["keyid"] || "";
    if (sigKeyid && sigKeyid !== keyid) {
      others.push(String(sigKeyid).slice(0, 80));
      continue;
    }
    try {
      if (await subtle().verify({ name: "Ed25519" }, key, b64decode(String(sig["sig"] ?? "")) as BufferSource, message as BufferSource)) {
        return [body, keyid];
      }
    } catch {
      // a malformed signature: the next one
    }
  }
  if (others.length > 0 && others.length === sigs.length) {
    throw new VerificationError(
      `no signature verifies with this public key: the receipt is signed by key ${others[0]}, this key is ${keyid}`,
    );
  }
  throw new VerificationError(`no signature verifies with this public key (key ${keyid})`);
}

function statementOf(body: Uint8Array): Record<string, any> {
  let statement: unknown;
  try {
    statement = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch {
    throw new VerificationError("the payload is not JSON");
  }
  if (!isObject(statement) || statement["_type"] !== STATEMENT_TYPE) {
    throw new VerificationError("not an in-toto Statement v1");
  }
  const type = statement["predicateType"];
  if (type !== PREDICATE_TYPE && type !== LIVE_CELL_PREDICATE_TYPE) {
    throw new VerificationError("not an agentjail run or live-cell predicate");
  }
  if ("subject" in statement && !Array.isArray(statement["subject"])) {
    throw new VerificationError("the statement's subject is not a list");
  }
  if (!isObject(statement["predicate"])) throw new VerificationError("the statement has no predicate");
  return statement;
}

const isFile = (v: unknown): v is File => typeof File !== "undefined" && v instanceof File;

function nameOf(content: Content): string {
  return isFile(content) ? content.name : "(bytes)";
}

async function checkArtifact(subjects: Array<Record<string, any>>, artifact: ArtifactArg): Promise<void> {
  let name: string;
  let content: Content;
  if (Array.isArray(artifact)) {
    [name, content] = artifact as readonly [string, Content];
  } else if (isFile(artifact)) {
    [name, content] = [artifact.name, artifact];
  } else if (isObject(artifact) && !(artifact instanceof Blob) && !(artifact instanceof ArrayBuffer) && !(artifact instanceof Uint8Array)) {
    const a = artifact as { name: string; content: Content };
    [name, content] = [a.name, a.content];
  } else {
    if (subjects.length !== 1) {
      throw new VerificationError(
        `an artifact given as bytes needs a name: the receipt has ${subjects.length} subjects`,
      );
    }
    [name, content] = [String(subjects[0]?.["name"] ?? ""), artifact as Content];
  }
  const base = name.split("/").pop() ?? name;
  let matches = subjects.filter((s) => s["name"] === name);
  if (matches.length === 0) matches = subjects.filter((s) => String(s["name"] ?? "").split("/").pop() === base);
  if (matches.length !== 1) throw new VerificationError(`artifact ${name} is not (exactly one) subject of the receipt`);
  const digest = matches[0]?.["digest"];
  const signed = isObject(digest) ? digest["sha256"] : undefined;
  if (typeof signed !== "string" || signed.toLowerCase() !== (await sha256Hex(content))) {
    throw new VerificationError(`artifact ${name} does not match the receipt`);
  }
}

async function checkDigest(predicate: Record<string, any>, which: "stdout" | "stderr" | "workspace", content: Content): Promise<void> {
  const [section, field, what] =
    which === "workspace"
      ? [predicate["workspace"], "after", "workspace checkpoint"]
      : [predicate[which], "sha256", `${which} log`];
  const signed = isObject(section) ? section[field] : undefined;
  if (typeof signed !== "string" || !signed.startsWith("sha256:")) {
    throw new VerificationError(`the receipt carries no digest of the ${what}`);
  }
  if ("sha256:" + (await sha256Hex(content)) !== signed.toLowerCase()) {
    throw new VerificationError(`${what} ${nameOf(content)} does not match the receipt`);
  }
}

/** What {@link verify} checks besides the signature. */
export interface VerifyOptions {
  /** The service's Ed25519 public key (PEM: `agentjail receipt pubkey` prints it). */
  publicKey: KeyArg;
  /** One artifact or a list of them, each checked against the subject of its name. */
  artifact?: ArtifactArg | ArtifactArg[];
  /** The command's stdout log (`client.logs(id, "stdout")`), checked against `predicate.stdout`. */
  stdout?: Content;
  /** The command's stderr log, checked against `predicate.stderr`. */
  stderr?: Content;
  /** A workspace checkpoint, checked against `predicate.workspace.after`. */
  workspace?: Content;
  /**
   * Accept a live session's cell receipt (signed by the service; its subject is the cell's
   * code, `code.py`). Refused otherwise: it is not a run's receipt, and a file a run wrote
   * could share its subject's name.
   */
  liveCell?: boolean;
}

/**
 * Verifies a run receipt offline, as `agentjail receipt verify` does. Resolves to the
 * {@link VerifiedReceipt}; rejects with {@link VerificationError} otherwise. A verified
 * receipt says what happened, not that it went well: check `status`.
 */
export async function verify(receipt: ReceiptArg, options: VerifyOptions): Promise<VerifiedReceipt> {
  const key = await loadPublicKey(options.publicKey);
  const [body, keyid] = await authenticPayload(await envelope(receipt), key);
  const statement = statementOf(body);
  if (statement["predicateType"] === LIVE_CELL_PREDICATE_TYPE && !options.liveCell) {
    throw new VerificationError("a live session's cell receipt, not a run's: pass liveCell: true to accept one");
  }
  const subjects: Array<Record<string, any>> = (Array.isArray(statement["subject"]) ? statement["subject"] : []).filter(isObject);
  const a = options.artifact;
  const artifacts: ArtifactArg[] = a === undefined ? [] : isPair(a) || !Array.isArray(a) ? [a as ArtifactArg] : (a as ArtifactArg[]);
  for (const x of artifacts) await checkArtifact(subjects, x);
  const predicate = statement["predicate"] as Record<string, any>;
  for (const which of ["stdout", "stderr", "workspace"] as const) {
    const content = options[which];
    if (content !== undefined) await checkDigest(predicate, which, content);
  }
  return new VerifiedReceipt(statement, keyid);
}

/** One `[name, content]` pair (not a list of artifacts). */
function isPair(a: unknown): boolean {
  return Array.isArray(a) && a.length === 2 && typeof a[0] === "string" && !Array.isArray(a[1]) && !isObject(a[1]) || (Array.isArray(a) && a.length === 2 && typeof a[0] === "string" && (a[1] instanceof Blob || a[1] instanceof Uint8Array || a[1] instanceof ArrayBuffer));
}

// ---------------------------------------------------------------------------------------------
// Sessions: the receipt chain

/**
 * RFC 8785 (JCS) canonical JSON of `value`: object members sorted by their UTF-16 code units,
 * no whitespace, strings escaped minimally, numbers as ECMAScript prints them.
 */
export function canonicalJson(value: unknown): Uint8Array {
  return utf8.encode(jcs(value));
}

function jcs(v: unknown): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new Error(`RFC 8785 has no form for ${v}`);
    return JSON.stringify(v);
  }
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(jcs).join(",") + "]";
  if (isObject(v)) {
    const keys = Object.keys(v).filter((k) => v[k] !== undefined).sort();
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + jcs(v[k])).join(",") + "}";
  }
  throw new Error(`RFC 8785: cannot canonicalise a ${typeof v}`);
}

/**
 * `sha256:` over the RFC 8785 canonical JSON of a receipt (its DSSE envelope): what the next
 * cell's receipt names as `predicate.session.previous_receipt_sha256`.
 */
export async function receiptDigest(receipt: ReceiptArg): Promise<string> {
  return "sha256:" + hex(await subtle().digest("SHA-256", canonicalJson(await envelope(receipt)) as BufferSource));
}

/** What {@link verifySession} checks. */
export interface VerifySessionOptions {
  publicKey: KeyArg;
  /** The session the receipts must name (default: the first receipt's). */
  sessionId?: string;
  /** What the first receipt names as the previous one (null unless the session was forked). */
  previous?: string | null;
}

/**
 * Verifies a session's receipt chain offline: `receipts` are its cells' receipts in order
 * (null for a cell without one). Each must verify on its own, name the session and its own
 * index, and name in `previous_receipt_sha256` the digest ({@link receiptDigest}) of the
 * latest earlier receipt; the first names `previous`. Resolves to the verified receipts;
 * rejects with {@link VerificationError} at the first broken link.
 */
export async function verifySession(
  receipts: ReadonlyArray<ReceiptArg | null | undefined>,
  options: VerifySessionOptions,
): Promise<VerifiedReceipt[]> {
  const out: VerifiedReceipt[] = [];
  const key = await loadPublicKey(options.publicKey);
  let sessionId = options.sessionId;
  let expectedPrevious: string | null = options.previous ?? null;
  for (let index = 0; index < receipts.length; index++) {
    const receipt = receipts[index];
    if (receipt === null || receipt === undefined) continue;
    const v = await verify(receipt, { publicKey: key, liveCell: true });
    const s = v.predicate["session"];
    if (!isObject(s)) throw new VerificationError(`cell ${index}: the receipt names no session`);
    if (sessionId === undefined) sessionId = String(s["id"]);
    if (s["id"] !== sessionId) {
      throw new VerificationError(`cell ${index}: the receipt names session ${repr(s["id"])}, not ${repr(sessionId)}`);
    }
    if (s["cell"] !== index) throw new VerificationError(`cell ${index}: the receipt names cell ${repr(s["cell"])}`);
    const prev = s["previous_receipt_sha256"] ?? null;
    if (prev !== expectedPrevious) {
      throw new VerificationError(
        `cell ${index}: the receipt names the previous receipt ${repr(prev)}, expected ${repr(expectedPrevious)}`,
      );
    }
    expectedPrevious = await receiptDigest(receipt);
    out.push(v);
  }
  return out;
}
