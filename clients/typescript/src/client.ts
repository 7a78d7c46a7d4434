/** The client of agentjail's HTTP API. */

import {
  AgentjailError, APIError, RateLimited, RunFailed, StreamError, TransportError, Unavailable,
  WaitTimeout, errorFor,
} from "./errors.js";
import { Follower, lines, type RunEvent } from "./sse.js";
import { verifySession, type KeyArg, type VerifiedReceipt } from "./verify.js";
import type { components } from "./models.js";

/** Every schema of the service's OpenAPI document, by name (generated: `models.ts`). */
export type Schemas = components["schemas"];
/** A run record as the service sends it. */
export type RunRecord = Schemas["RunView"];
/** One run of a list of runs. */
export type RunSummary = Schemas["RunSummary"];
/** A stored input. */
export type Input = Schemas["InputCreated"];
/** A session as the service sends it. */
export type SessionRecord = Schemas["SessionView"];
/** A task the caller may use. */
export type TaskView = Schemas["TaskView"];
/** What a command wrote on one stream, as a run record shows it. */
export type StreamView = Schemas["StreamView"];

export type { RunEvent };

const FINAL = new Set(["ok", "exit_nonzero", "signaled", "timeout", "memory_limit", "output_rejected", "setup_error", "expired", "unknown", "abandoned", "cancelled"]);

/** A run: its record, with helpers. A run that ended badly is a result, not an error. */
export class Run {
  constructor(readonly record: RunRecord) {}
  /** The run's execute-once request id. */
  get requestId(): string { return this.record.request_id; }
  /** The task type it ran. */
  get task(): string { return this.record.task; }
  /** `queued`, `running`, or how it ended (`ok`, `exit_nonzero`, `timeout`, …). */
  get status(): string { return this.record.status; }
  /** Why it ended as it did, in words (undefined while it runs, and for most `ok` runs). */
  get reason(): string | undefined { return this.record.reason ?? undefined; }
  /** Whether the run has ended (any status but `queued` and `running`). */
  get finished(): boolean { return FINAL.has(this.record.status); }
  /** Whether it ended `ok`: exited 0 and its output verified. */
  get ok(): boolean { return this.record.status === "ok"; }
  /** The command's exit code, from the report, when it has one. */
  get exitCode(): number | undefined {
    const r = this.report["exit_code"];
    return typeof r === "number" ? r : undefined;
  }
  /** The run report (empty before the end). */
  get report(): Record<string, any> {
    const r: unknown = this.record.report;
    return typeof r === "object" && r !== null ? (r as Record<string, any>) : {};
  }
  /** Every refusal the report lists. */
  get denials(): Array<Record<string, any>> {
    const d: unknown = this.report["denials"];
    if (Array.isArray(d)) return d as Array<Record<string, any>>;
    if (typeof d === "object" && d !== null && Array.isArray((d as any).items)) return (d as any).items;
    return [];
  }
  private stream(which: "stdout" | "stderr"): string {
    const s = this.record[which] as StreamView | null | undefined;
    if (!s) return "";
    return s.omitted_bytes ? `${s.head}\n[… ${s.omitted_bytes} bytes omitted …]\n${s.tail}` : s.head + s.tail;
  }
  /** What the command wrote on stdout, as the record shows it (head and tail; untrusted text). */
  get stdout(): string { return this.stream("stdout"); }
  /** What the command wrote on stderr, as the record shows it (untrusted text). */
  get stderr(): string { return this.stream("stderr"); }
  /** The end of stderr (where a traceback is), at most 4000 characters; untrusted. */
  get stderrTail(): string {
    return this.stderr.slice(-4000);
  }
  /** The verified artifact: parsed JSON, else its bytes (status `ok` only). */
  get artifact(): unknown {
    const a = this.record.artifact as Record<string, any> | null | undefined;
    if (!a) return undefined;
    if ("json" in a) return a["json"];
    return this.artifactBytes;
  }
  /** The verified artifact's bytes (status `ok` only). */
  get artifactBytes(): Uint8Array | undefined {
    const a = this.record.artifact as Record<string, any> | null | undefined;
    if (!a) return undefined;
    if (typeof a["base64"] === "string") return Uint8Array.from(atob(a["base64"]), (c) => c.charCodeAt(0));
    return new TextEncoder().encode(JSON.stringify(a["json"]));
  }
  /** The signed receipt (a DSSE envelope), when the run has one. */
  get receipt(): Record<string, any> | undefined {
    const r: unknown = this.record.receipt;
    return typeof r === "object" && r !== null ? (r as Record<string, any>) : undefined;
  }
  /** Returns the run when it is `ok`; throws {@link RunFailed} with the stderr tail otherwise. */
  raiseForStatus(): this {
    if (!this.ok) throw new RunFailed(this.requestId, this.status, this.stderrTail, this.reason);
    return this;
  }
}

/** A cell of a session: a run, plus its session, index and workspace digests. */
export class Cell extends Run {
  /** The session the cell belongs to. */
  get sessionId(): string { return String((this.record as any).session_id); }
  /** Its index in the session, from 0. */
  get cell(): number { return Number((this.record as any).cell); }
  /** The step's request id (execute-once within the session). */
  get cellRequestId(): string { return String((this.record as any).cell_request_id); }
  /** The checkpoints (`sha256:…`) restored into `/work` before the cell and collected after it (`null`: empty, none kept, or a live cell). */
  get workspace(): { before?: string | null; after?: string | null } {
    return ((this.record as any).workspace ?? {}) as { before?: string | null; after?: string | null };
  }
}

/** A retained log: its bytes and what the service says of them. */
export interface Log {
  bytes: Uint8Array;
  /** `sha256:…` when nothing was masked: the digest the receipt signs. */
  sha256: string | undefined;
  /** How many secrets were masked with `*`. */
  masked: number;
  /** The bytes as text (untrusted). */
  text: string;
}

/** An input's content: a Blob (a File carries its name), bytes, or text. */
export type Upload = Blob | Uint8Array | ArrayBuffer | string;

/** How a {@link Client} reaches the service. */
export interface ClientOptions {
  /** The service's base URL (default `AGENTJAIL_URL` in Node, else `http://127.0.0.1:8787`). */
  baseUrl?: string;
  /** The bearer token (default `AGENTJAIL_TOKEN` in Node). */
  token?: string;
  /** How many times a 429 or 503 is retried after its `Retry-After` (default 3). */
  retries?: number;
  /** The longest wait of one retry, in seconds (default 30). */
  maxRetryAfter?: number;
  /** The `fetch` to use (default the global one). */
  fetch?: typeof fetch;
  /** How many times an event stream is reconnected (default 10). */
  maxReconnects?: number;
}

/** What a run is submitted with. */
export interface SubmitOptions {
  /** The code to run (tasks with `code = "allowed"`). */
  code?: string;
  /** Arguments (paths below the task's folders). */
  args?: string[];
  /** The execute-once request id (default a fresh `crypto.randomUUID()`). */
  requestId?: string;
  /** Aborts the request (not the run: cancel it with `Client.cancel`). */
  signal?: AbortSignal;
}

/** A submitted run waited for: a time limit and a live-event callback. */
export interface RunOptions extends SubmitOptions {
  /** Seconds to wait for the end; past it {@link WaitTimeout} (default: as long as it takes). */
  timeout?: number;
  /** Called with each live event: the run is submitted and followed in one request. */
  onEvent?: (event: RunEvent) => void | Promise<void>;
}

/** Filters and paging of a run listing. */
export interface ListOptions {
  /** Only runs with this status. */
  status?: string;
  /** Only runs of this task type. */
  task?: string;
  /** Only runs created at or after this RFC 3339 instant. */
  createdAfter?: string;
  /** Only runs created before this RFC 3339 instant. */
  createdBefore?: string;
  /** Only this tenant's runs (operators). */
  tenant?: string;
  /** The page size (1-100). */
  limit?: number;
  cursor?: string;
}

const env = (name: string): string | undefined =>
  (globalThis as any).process?.env?.[name] as string | undefined;

const sleep = (s: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    const t = setTimeout(resolve, s * 1000);
    signal?.addEventListener("abort", () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });

const seg = encodeURIComponent;

function guessMediaType(name: string): string {
  const ext = name.toLowerCase().split(".").pop() ?? "";
  return ({ csv: "text/csv", json: "application/json", txt: "text/plain", md: "text/markdown", py: "text/x-python", html: "text/html", xml: "application/xml", pdf: "application/pdf", png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", zip: "application/zip", tar: "application/x-tar", gz: "application/gzip" } as Record<string, string>)[ext] ?? "application/octet-stream";
}

interface Call {
  method: string;
  path: string;
  query?: Record<string, string | undefined>;
  json?: unknown;
  body?: BodyInit;
  headers?: Record<string, string>;
  signal?: AbortSignal | undefined;
}

/** The agentjail client. */
export class Client {
  readonly baseUrl: string;
  readonly token: string | undefined;
  readonly retries: number;
  readonly maxRetryAfter: number;
  readonly maxReconnects: number;
  private readonly fetchFn: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? env("AGENTJAIL_URL") ?? "http://127.0.0.1:8787").replace(/\/+$/, "");
    this.token = options.token ?? env("AGENTJAIL_TOKEN");
    this.retries = options.retries ?? 3;
    this.maxRetryAfter = options.maxRetryAfter ?? 30;
    this.maxReconnects = options.maxReconnects ?? 10;
    this.fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  private url(path: string, query?: Record<string, string | undefined>): string {
    const u = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) u.searchParams.set(k, v);
    return u.toString();
  }

  /** Sends a request; a 429 or 503 is retried after its `Retry-After` (safe: request ids run once). */
  private async send(call: Call): Promise<Response> {
    const headers: Record<string, string> = { ...call.headers };
    if (this.token) headers["authorization"] = `Bearer ${this.token}`;
    let body = call.body;
    if (call.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(call.json);
    }
    for (let attempt = 0; ; attempt++) {
      let res: Response;
      try {
        res = await this.fetchFn(this.url(call.path, call.query), { method: call.method, headers, body: body ?? null, signal: call.signal ?? null });
      } catch (e) {
        if (call.signal?.aborted) throw e;
        throw new TransportError(`${call.method} ${call.path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
      }
      if (res.ok) return res;
      const error = await problemOf(res);
      if ((error instanceof RateLimited || error instanceof Unavailable) && attempt < this.retries) {
        const wait = Math.min(error.retryAfter ?? 2 ** attempt, this.maxRetryAfter);
        await sleep(wait, call.signal);
        continue;
      }
      throw error;
    }
  }

  private async json<T>(call: Call): Promise<T> {
    return (await (await this.send(call)).json()) as T;
  }

  // --- inputs -------------------------------------------------------------------------------

  /** Uploads an input; `name` defaults to a File's name, `mediaType` is guessed from the name. */
  async upload(content: Upload, options: { name?: string; mediaType?: string } = {}): Promise<Input> {
    const name = options.name ?? (typeof File !== "undefined" && content instanceof File ? content.name : "input");
    const mediaType = options.mediaType ?? guessMediaType(name);
    return this.json<Input>({
      method: "POST", path: "/v1/inputs", query: { name, media_type: mediaType },
      body: content as BodyInit, headers: { "content-type": "application/octet-stream" },
    });
  }

  // --- runs ---------------------------------------------------------------------------------

  private runBody(task: string, inputs: ReadonlyArray<Input | string>, o: SubmitOptions): Record<string, unknown> {
    const body: Record<string, unknown> = {
      request_id: o.requestId ?? globalThis.crypto.randomUUID(),
      task,
      inputs: inputs.map((i) => (typeof i === "string" ? i : i.input_id)),
    };
    if (o.code !== undefined) body["code"] = o.code;
    if (o.args !== undefined) body["args"] = o.args;
    return body;
  }

  /** Submits a run and returns at once (`queued`, or the record of a replay). */
  async submit(task: string, inputs: ReadonlyArray<Input | string> = [], options: SubmitOptions = {}): Promise<Run> {
    const body = this.runBody(task, inputs, options);
    return new Run(await this.json<RunRecord>({ method: "POST", path: "/v1/runs", query: { wait: "false" }, json: body, signal: options.signal }));
  }

  /**
   * Runs a task and resolves to the run whatever its status (`raiseForStatus()` to throw
   * unless `ok`). With `onEvent`, the run is submitted and followed in one request
   * (`Accept: text/event-stream`), resumed with `Last-Event-ID` after a dropped connection.
   */
  async run(task: string, inputs: ReadonlyArray<Input | string> = [], options: RunOptions = {}): Promise<Run> {
    const body = this.runBody(task, inputs, options);
    const requestId = body["request_id"] as string;
    const t0 = Date.now();
    if (options.onEvent) {
      const follower = new Follower(requestId, undefined, this.maxReconnects);
      // The deadline aborts the stream wherever it is (reading, or between reconnects).
      const deadline = options.timeout === undefined ? undefined : AbortSignal.timeout(options.timeout * 1000);
      const signal = deadline && options.signal ? AbortSignal.any([options.signal, deadline]) : (deadline ?? options.signal);
      const first = (): Promise<Response> =>
        this.send({ method: "POST", path: "/v1/runs", json: body, headers: follower.headers(), signal });
      try {
        for await (const ev of this.stream(follower, first, signal)) {
          await options.onEvent(ev);
          if (ev.event === "ended") return new Run(ev.data as RunRecord);
        }
      } catch (e) {
        if (deadline?.aborted && !options.signal?.aborted) {
          throw new WaitTimeout(`run ${requestId} did not end within ${options.timeout} s`, { cause: e });
        }
        throw e;
      }
      throw new StreamError(`the event stream of run ${requestId} ended without \`ended\``);
    }
    const held = options.timeout === undefined;
    const run = new Run(await this.json<RunRecord>({ method: "POST", path: "/v1/runs", query: { wait: held ? "true" : "false" }, json: body, signal: options.signal }));
    return run.finished ? run : this.waitFrom(requestId, options.timeout, t0, options.signal);
  }

  /** The run's record now. */
  async get(requestId: string, options: { signal?: AbortSignal } = {}): Promise<Run> {
    return new Run(await this.json<RunRecord>({ method: "GET", path: `/v1/runs/${seg(requestId)}`, signal: options.signal }));
  }

  /** Waits for the run's end (polling); past `timeout` seconds {@link WaitTimeout}. */
  wait(requestId: string, options: { timeout?: number; signal?: AbortSignal } = {}): Promise<Run> {
    return this.waitFrom(requestId, options.timeout, Date.now(), options.signal);
  }

  private async waitFrom(requestId: string, timeout: number | undefined, t0: number, signal?: AbortSignal): Promise<Run> {
    let delay = 0.1;
    for (;;) {
      const run = await this.get(requestId, signal ? { signal } : {});
      if (run.finished) return run;
      const elapsed = (Date.now() - t0) / 1000;
      if (timeout !== undefined && elapsed >= timeout) {
        throw new WaitTimeout(`run ${requestId} did not end within ${timeout} s (it is ${run.status})`);
      }
      await sleep(timeout === undefined ? delay : Math.min(delay, timeout - elapsed), signal);
      delay = Math.min(delay * 2, 1);
    }
  }

  /** Cancels the run; with `wait` (default), waits for its end. */
  async cancel(requestId: string, options: { wait?: boolean; timeout?: number } = {}): Promise<Run> {
    const run = new Run(await this.json<RunRecord>({ method: "POST", path: `/v1/runs/${seg(requestId)}/cancel` }));
    if ((options.wait ?? true) && !run.finished) {
      return this.wait(requestId, options.timeout === undefined ? {} : { timeout: options.timeout });
    }
    return run;
  }

  /** One page of the caller's runs, newest first. */
  async listPage(options: ListOptions = {}): Promise<{ runs: RunSummary[]; nextCursor: string | undefined }> {
    const body = await this.json<Schemas["RunList"]>({
      method: "GET", path: "/v1/runs",
      query: {
        status: options.status, task: options.task, created_after: options.createdAfter,
        created_before: options.createdBefore, tenant: options.tenant,
        limit: options.limit === undefined ? undefined : String(options.limit), cursor: options.cursor,
      },
    });
    return { runs: body.runs, nextCursor: body.next_cursor ?? undefined };
  }

  /** Every run of the caller matching the filters, newest first, page after page. */
  async *list(options: ListOptions = {}): AsyncGenerator<RunSummary> {
    let cursor = options.cursor;
    for (;;) {
      const page = await this.listPage({ ...options, cursor });
      yield* page.runs;
      if (!page.nextCursor) return;
      cursor = page.nextCursor;
    }
  }

  /** The full retained log of a stream. */
  async logs(requestId: string, stream: "stdout" | "stderr" = "stdout"): Promise<Log> {
    const res = await this.send({ method: "GET", path: `/v1/runs/${seg(requestId)}/logs`, query: { stream } });
    const bytes = new Uint8Array(await res.arrayBuffer());
    return {
      bytes,
      sha256: res.headers.get("x-agentjail-sha256") ?? undefined,
      masked: Number(res.headers.get("x-agentjail-masked") ?? 0),
      text: new TextDecoder().decode(bytes),
    };
  }

  /** The verified artifact's bytes (status `ok` only; else `Conflict` `no-verified-artifact`). */
  async artifact(requestId: string): Promise<Uint8Array> {
    const res = await this.send({ method: "GET", path: `/v1/runs/${seg(requestId)}/artifact` });
    return new Uint8Array(await res.arrayBuffer());
  }

  /** The run's signed receipt (a DSSE envelope). */
  receipt(requestId: string): Promise<Record<string, any>> {
    return this.json({ method: "GET", path: `/v1/runs/${seg(requestId)}/receipt` });
  }

  /** Operators: decides an `unknown` run. */
  async reconcile(requestId: string, action: "retry" | "abandon"): Promise<Run> {
    return new Run(await this.json<RunRecord>({ method: "POST", path: `/v1/runs/${seg(requestId)}/reconcile`, json: { action } }));
  }

  // --- live events --------------------------------------------------------------------------

  /**
   * The run's live events, `queued` to `ended`, as an async iterator. A dropped connection is
   * resumed with `Last-Event-ID`: no chunk is lost or repeated.
   */
  events(requestId: string, options: { lastEventId?: string; signal?: AbortSignal } = {}): AsyncGenerator<RunEvent> {
    const follower = new Follower(requestId, options.lastEventId, this.maxReconnects);
    return this.stream(follower, undefined, options.signal);
  }

  /** Follows the run, calling `onEvent` for each event; resolves to the final run. */
  async follow(requestId: string, onEvent: (event: RunEvent) => void | Promise<void>, options: { lastEventId?: string; signal?: AbortSignal } = {}): Promise<Run> {
    for await (const ev of this.events(requestId, options)) {
      await onEvent(ev);
      if (ev.event === "ended") return new Run(ev.data as RunRecord);
    }
    throw new StreamError(`the event stream of run ${requestId} ended without \`ended\``);
  }

  private async *stream(follower: Follower, first: (() => Promise<Response>) | undefined, signal: AbortSignal | undefined): AsyncGenerator<RunEvent> {
    let connect = first;
    while (!follower.ended) {
      let error: unknown;
      try {
        const res = connect
          ? await connect()
          : await this.send({ method: "GET", path: `/v1/runs/${seg(follower.requestId)}/events`, headers: follower.headers(), signal });
        if (!res.body) throw new StreamError("the event stream has no body");
        for await (const line of lines(res.body)) {
          const ev = follower.line(line);
          if (ev) {
            follower.reconnects = 0;
            yield ev;
            if (follower.ended) return;
          }
        }
      } catch (e) {
        if (signal?.aborted || e instanceof StreamError) throw e;
        if (e instanceof AgentjailError && !(e instanceof APIError) && !(e instanceof TransportError)) throw e;
        error = e;
      }
      // A submit-and-follow that broke before its first event is sent again (the request id
      // runs once): the run may not exist yet, so `GET …/events` could not find it.
      connect = first !== undefined && follower.lastEventId === undefined && !(error instanceof APIError) ? first : undefined;
      follower.dropped(error);
      if (!follower.ended) await sleep(Math.min(0.2 * follower.reconnects, 2), signal);
    }
  }

  // --- sessions -----------------------------------------------------------------------------

  /** Opens a session of a task (execute-once per request id). */
  async session(task: string, inputs: ReadonlyArray<Input | string> = [], options: { requestId?: string } = {}): Promise<Session> {
    const body = { request_id: options.requestId ?? globalThis.crypto.randomUUID(), task, inputs: inputs.map((i) => (typeof i === "string" ? i : i.input_id)) };
    return new Session(this, await this.json<SessionRecord>({ method: "POST", path: "/v1/sessions", json: body }));
  }

  /** A session by its id. */
  async getSession(sessionId: string): Promise<Session> {
    return new Session(this, await this.json<SessionRecord>({ method: "GET", path: `/v1/sessions/${seg(sessionId)}` }));
  }

  /** Runs the next cell of a session; a retry of the same `requestId` returns the recorded cell. */
  async runCell(sessionId: string, code: string, options: { requestId?: string; timeout?: number } = {}): Promise<Cell> {
    const body = { request_id: options.requestId ?? globalThis.crypto.randomUUID(), code };
    const path = `/v1/sessions/${seg(sessionId)}/cells`;
    const t0 = Date.now();
    const held = options.timeout === undefined;
    const cell = new Cell(await this.json<RunRecord>({ method: "POST", path, query: { wait: held ? "true" : "false" }, json: body }));
    if (cell.finished) return cell;
    await this.waitFrom(cell.requestId, options.timeout, t0);
    // The replay of the same step answers the recorded cell, now final.
    return new Cell(await this.json<RunRecord>({ method: "POST", path, query: { wait: "false" }, json: body }));
  }

  /** One page of a session's cells, in order. */
  async cellsPage(sessionId: string, options: { limit?: number; cursor?: string } = {}): Promise<{ cells: Cell[]; nextCursor: string | undefined }> {
    const body = await this.json<{ cells: RunRecord[]; next_cursor?: string | null }>({
      method: "GET", path: `/v1/sessions/${seg(sessionId)}/cells`,
      query: { limit: options.limit === undefined ? undefined : String(options.limit), cursor: options.cursor },
    });
    return { cells: body.cells.map((c) => new Cell(c)), nextCursor: body.next_cursor ?? undefined };
  }

  /** Every cell of a session, in order, page after page. */
  async *cells(sessionId: string, options: { pageSize?: number } = {}): AsyncGenerator<Cell> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.cellsPage(sessionId, { ...(options.pageSize === undefined ? {} : { limit: options.pageSize }), ...(cursor === undefined ? {} : { cursor }) });
      yield* page.cells;
      if (!page.nextCursor) return;
      cursor = page.nextCursor;
    }
  }

  /** A new session from a checkpoint of this one (default: its head). */
  async forkSession(sessionId: string, options: { cell?: number; requestId?: string } = {}): Promise<Session> {
    const body: Record<string, unknown> = { request_id: options.requestId ?? globalThis.crypto.randomUUID() };
    if (options.cell !== undefined) body["cell"] = options.cell;
    return new Session(this, await this.json<SessionRecord>({ method: "POST", path: `/v1/sessions/${seg(sessionId)}/fork`, json: body }));
  }

  /** Checkpoints a session's workspace now (a live session's interpreter keeps running). */
  async checkpointSession(sessionId: string): Promise<Session> {
    return new Session(this, await this.json<SessionRecord>({ method: "POST", path: `/v1/sessions/${seg(sessionId)}/checkpoint` }));
  }

  /** Ends a session (idempotent). */
  async closeSession(sessionId: string): Promise<Session> {
    return new Session(this, await this.json<SessionRecord>({ method: "DELETE", path: `/v1/sessions/${seg(sessionId)}` }));
  }

  // --- the rest -----------------------------------------------------------------------------

  /** The tasks the caller may use. */
  async tasks(): Promise<TaskView[]> {
    return (await this.json<Schemas["TaskList"]>({ method: "GET", path: "/v1/tasks" })).tasks;
  }

  /** `/healthz`. */
  health(): Promise<Record<string, any>> {
    return this.json({ method: "GET", path: "/healthz" });
  }

  /** The service's OpenAPI document. */
  openapi(): Promise<Record<string, any>> {
    return this.json({ method: "GET", path: "/openapi.json" });
  }
}

async function problemOf(res: Response): Promise<APIError> {
  let problem: Record<string, unknown> = { status: res.status, title: res.statusText };
  try {
    const text = await res.text();
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) problem = parsed as Record<string, unknown>;
  } catch {
    // not problem+json: the status says it
  }
  return errorFor(res.status, problem, res.headers);
}

/** A session: cells that share a persistent `/work`. Close it (`await using`, or `close()`). */
export class Session {
  constructor(private readonly client: Client, public record: SessionRecord) {}
  /** The session's id (`ses_…`). */
  get sessionId(): string { return this.record.session_id; }
  /** The task type its cells run. */
  get task(): string { return this.record.task; }
  /** `open` or `closed` (as last read). */
  get state(): string { return String(this.record.state); }
  /** The execute-once request id it was opened with. */
  get requestId(): string { return String((this.record as any).request_id); }

  /** Runs the next cell (`requestId`: the step's execute-once id, default fresh). */
  run(code: string, options: { requestId?: string; timeout?: number } = {}): Promise<Cell> {
    return this.client.runCell(this.sessionId, code, options);
  }
  /** Every cell, in order. */
  cells(options: { pageSize?: number } = {}): AsyncGenerator<Cell> {
    return this.client.cells(this.sessionId, options);
  }
  /** One page of cells. */
  cellsPage(options: { limit?: number; cursor?: string } = {}): Promise<{ cells: Cell[]; nextCursor: string | undefined }> {
    return this.client.cellsPage(this.sessionId, options);
  }
  /** Reads the session again. */
  async refresh(): Promise<this> {
    this.record = (await this.client.getSession(this.sessionId)).record;
    return this;
  }
  /** A new session from the workspace as `cell` left it (default: the head). */
  fork(options: { cell?: number; requestId?: string } = {}): Promise<Session> {
    return this.client.forkSession(this.sessionId, options);
  }
  /**
   * Checkpoints the workspace now and resolves to its digest (`sha256:…`; null for an empty
   * one). A live session's interpreter keeps running; a fork from the last cell starts here.
   */
  async checkpoint(): Promise<string | null> {
    this.record = (await this.client.checkpointSession(this.sessionId)).record;
    return this.record.workspace_sha256 ?? null;
  }
  /** Ends the session (idempotent). */
  async close(): Promise<void> {
    this.record = (await this.client.closeSession(this.sessionId)).record;
  }
  /** Closes the session at the end of an `await using` block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
  /** Fetches every cell's receipt and verifies the chain offline with the service's public key. */
  async verifyChain(publicKey: KeyArg, options: { previous?: string | null } = {}): Promise<VerifiedReceipt[]> {
    const receipts: Array<Record<string, any> | null> = [];
    for await (const c of this.cells()) receipts.push(c.receipt ?? null);
    return verifySession(receipts, { publicKey, sessionId: this.sessionId, previous: options.previous ?? null });
  }
}
