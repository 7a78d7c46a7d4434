/**
 * `agentjail`: a client of agentjail's HTTP API for Node ≥ 20 and browsers (ESM, `fetch`,
 * WebCrypto; no runtime dependencies). Node-only helpers (files from paths) are in
 * `agentjail/node`.
 *
 * @packageDocumentation
 */
/** This client's version (it follows the service's). */
export const VERSION = "0.1.0";
export * from "./errors.js";
export * from "./client.js";
export { SSEDecoder, Follower, type RunEvent } from "./sse.js";
export {
  verify, verifySession, receiptDigest, canonicalJson, loadPublicKey, keyidOf, sha256Hex, pae,
  VerificationError, VerifiedReceipt, PAYLOAD_TYPE, STATEMENT_TYPE, PREDICATE_TYPE, LIVE_CELL_PREDICATE_TYPE,
  type Content, type ArtifactArg, type ReceiptArg, type KeyArg, type VerifyOptions,
  type VerifySessionOptions,
} from "./verify.js";
export type { components, paths, operations } from "./models.js";
