/**
 * The errors the client throws. Every answer of the service that is not a success is an
 * {@link APIError} (a subclass per status or problem type) carrying the RFC 9457
 * problem-details body. A run that ended badly is *not* an error: it is a {@link Run} whose
 * `ok` is false (`run.raiseForStatus()` turns it into {@link RunFailed}).
 */

export const PROBLEM_BASE = "https://agentjail.dev/problems/";

/** The RFC 9457 problem-details body. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  [key: string]: unknown;
}

/** The base of every error of this package (but {@link VerificationError}). */
export class AgentjailError extends Error {
  override name = "AgentjailError";
}

/** The service answered with an error (`application/problem+json`). */
export class APIError extends AgentjailError {
  override name = "APIError";
  readonly status: number;
  /** The problem type, e.g. `https://agentjail.dev/problems/not-found`. */
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  /** The whole problem-details body as the service sent it. */
  readonly problem: Record<string, unknown>;
  readonly headers: Headers;

  constructor(status: number, problem: Record<string, unknown>, headers?: Headers) {
    const type = typeof problem["type"] === "string" ? problem["type"] : "about:blank";
    const title = typeof problem["title"] === "string" ? problem["title"] : "";
    const detail = typeof problem["detail"] === "string" ? problem["detail"] : "";
    const slug = type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
    super(`${status} ${slug || title}: ${detail}`);
    this.status = status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.problem = problem;
    this.headers = headers ?? new Headers();
  }

  /** The problem type's last part (`not-found`, `request-id-conflict`, …). */
  get slug(): string {
    return this.type.startsWith(PROBLEM_BASE) ? this.type.slice(PROBLEM_BASE.length) : "";
  }
}

/** 400: malformed request, unknown field, bad request id or argument. */
export class BadRequest extends APIError { override name = "BadRequest"; }
/** 401: missing or wrong bearer token. */
export class Unauthorized extends APIError { override name = "Unauthorized"; }
/** 403: the policy refuses it. */
export class Refused extends APIError { override name = "Refused"; }
/** 404: unknown task, endpoint, input, run or session (or one of another tenant: the same answer). */
export class NotFound extends APIError { override name = "NotFound"; }
/** 405: the endpoint does not take this method. */
export class MethodNotAllowed extends APIError { override name = "MethodNotAllowed"; }
/** 408: the body did not arrive in time. */
export class RequestTimeout extends APIError { override name = "RequestTimeout"; }
/** 409: a request id reused with another body, no verified artifact, no receipt, … (`slug` tells which). */
export class Conflict extends APIError { override name = "Conflict"; }
/** 409 `cell-in-progress`: the session's previous cell is still queued or running. */
export class CellInProgress extends Conflict { override name = "CellInProgress"; }
/** 409 `session-closed`: the session was ended; it takes no cell. */
export class SessionClosed extends Conflict { override name = "SessionClosed"; }
/** 409 `session-expired`: the session's lifetime passed. */
export class SessionExpired extends Conflict { override name = "SessionExpired"; }
/** 409 `session-cell-limit`: the session ran its task's `session.max_cells`. */
export class SessionCellLimit extends Conflict { override name = "SessionCellLimit"; }
/** 409 `checkpoint-invalid`: the session's checkpoint no longer matches its stored bytes. */
export class CheckpointInvalid extends Conflict { override name = "CheckpointInvalid"; }
/** 410: outputs or logs deleted by retention. */
export class Gone extends APIError { override name = "Gone"; }
/** 413: the body is larger than the service accepts. */
export class TooLarge extends APIError { override name = "TooLarge"; }
/** 415: wrong content type. */
export class UnsupportedMediaType extends APIError { override name = "UnsupportedMediaType"; }
/** 422: the inputs do not match the task. */
export class InputMismatch extends APIError { override name = "InputMismatch"; }

function retryAfterOf(headers: Headers): number | undefined {
  const v = headers.get("retry-after");
  if (v === null) return undefined;
  const n = Number(v.trim());
  if (Number.isFinite(n) && n >= 0) return n;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, (t - Date.now()) / 1000);
}

/** 429: every run slot and the queue are full; retry after `retryAfter` seconds. */
export class RateLimited extends APIError {
  override name = "RateLimited";
  /** The `Retry-After` header in seconds (undefined when absent). */
  get retryAfter(): number | undefined { return retryAfterOf(this.headers); }
}
/** 501 `sessions-unsupported`: the service's store keeps no sessions (older servers). */
export class SessionsUnsupported extends APIError { override name = "SessionsUnsupported"; }
/** 503: the service (its database) cannot be reached right now; retry after `retryAfter`. */
export class Unavailable extends APIError {
  override name = "Unavailable";
  /** The `Retry-After` header in seconds (undefined when absent). */
  get retryAfter(): number | undefined { return retryAfterOf(this.headers); }
}
/** 5xx: an internal error of the service. */
export class ServerError extends APIError { override name = "ServerError"; }

/** A wait for a run's end took longer than the timeout given. */
export class WaitTimeout extends AgentjailError { override name = "WaitTimeout"; }
/** The service could not be reached or the connection broke. */
export class TransportError extends AgentjailError { override name = "TransportError"; }
/** A run's event stream broke in a way resuming cannot mend. */
export class StreamError extends AgentjailError { override name = "StreamError"; }

/** `run.raiseForStatus()` on a run that did not end `ok`. */
export class RunFailed extends AgentjailError {
  override name = "RunFailed";
  readonly status: string;
  readonly stderrTail: string;
  constructor(readonly requestId: string, status: string, stderrTail: string, reason?: string) {
    super(`run ${requestId} ended ${status}${reason ? ` (${reason})` : ""}${stderrTail ? `: ${stderrTail.slice(-500)}` : ""}`);
    this.status = status;
    this.stderrTail = stderrTail;
  }
}

const BY_SLUG: Record<string, typeof APIError> = {
  "cell-in-progress": CellInProgress,
  "session-closed": SessionClosed,
  "session-expired": SessionExpired,
  "session-cell-limit": SessionCellLimit,
  "checkpoint-invalid": CheckpointInvalid,
  "sessions-unsupported": SessionsUnsupported,
};

const BY_STATUS: Record<number, typeof APIError> = {
  400: BadRequest, 401: Unauthorized, 403: Refused, 404: NotFound, 405: MethodNotAllowed,
  408: RequestTimeout, 409: Conflict, 410: Gone, 413: TooLarge, 415: UnsupportedMediaType,
  422: InputMismatch, 429: RateLimited, 503: Unavailable,
};

/** The error for a status and problem body. */
export function errorFor(status: number, problem: Record<string, unknown>, headers?: Headers): APIError {
  const type = typeof problem["type"] === "string" ? problem["type"] : "";
  const slug = type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
  const cls = BY_SLUG[slug] ?? BY_STATUS[status] ?? (status >= 500 ? ServerError : APIError);
  return new cls(status, problem, headers);
}
