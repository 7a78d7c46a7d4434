/** Server-Sent Events: a decoder of `text/event-stream` and the state of following a run. */

import { APIError, StreamError } from "./errors.js";

/** One event of a run: `queued`, `started`, `stdout`, `stderr`, `denial` or `ended`. */
export interface RunEvent {
  /** The event's name. */
  event: string;
  /** Its id, the follower's position (send it back as `Last-Event-ID` to resume after it). */
  id: string;
  /** Its data, parsed: `{offset, bytes, text, untrusted}` for a chunk, the final record for `ended`. */
  data: Record<string, any>;
}

/** Turns the lines of a `text/event-stream` into events, as the WHATWG interpretation does. */
export class SSEDecoder {
  private event = "";
  private id: string | undefined;
  private data: string[] = [];

  /** Feeds one line (without its end of line); returns `[event, id, data]` when a blank line completes one. */
  line(line: string): [string, string | undefined, string] | undefined {
    if (line === "") {
      if (this.data.length === 0 && !this.event) {
        this.id = undefined;
        return undefined;
      }
      const out: [string, string | undefined, string] = [this.event || "message", this.id, this.data.join("\n")];
      this.event = "";
      this.id = undefined;
      this.data = [];
      return out;
    }
    if (line.startsWith(":")) return undefined;
    const i = line.indexOf(":");
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return undefined;
  }
}

/** Splits a byte stream into lines (CRLF, LF or CR), decoding UTF-8 across chunk boundaries. */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buf = "";
  let pendingCR = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let start = 0;
      for (let i = 0; i < buf.length; i++) {
        const c = buf[i];
        if (c === "\n" && pendingCR) {
          pendingCR = false;
          start = i + 1;
          continue;
        }
        pendingCR = false;
        if (c === "\n" || c === "\r") {
          yield buf.slice(start, i);
          start = i + 1;
          if (c === "\r") pendingCR = true;
        }
      }
      buf = buf.slice(start);
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}

/**
 * The state of following one run's events across connections: the last event id (sent back
 * as `Last-Event-ID` on a reconnect), the offset reached in each stream (a chunk already seen
 * is dropped, a gap is an error), and whether `ended` came.
 */
export class Follower {
  lastEventId: string | undefined;
  reconnects = 0;
  ended = false;
  offsets: { stdout: number | undefined; stderr: number | undefined } = { stdout: undefined, stderr: undefined };
  decoder = new SSEDecoder();

  constructor(readonly requestId: string, lastEventId: string | undefined, readonly maxReconnects: number) {
    this.lastEventId = lastEventId;
    if (lastEventId !== undefined) {
      const parts = lastEventId.split(".");
      if (parts.length >= 3 && parts.every((p) => /^[0-9]+$/.test(p))) {
        this.offsets = { stdout: Number(parts[1]), stderr: Number(parts[2]) };
      }
    }
  }

  /** The headers of the next connection. */
  headers(): Record<string, string> {
    this.decoder = new SSEDecoder();
    const h: Record<string, string> = { accept: "text/event-stream" };
    if (this.lastEventId !== undefined) h["last-event-id"] = this.lastEventId;
    return h;
  }

  /** Feeds one line; returns the next event to hand out, if it completes one. */
  line(line: string): RunEvent | undefined {
    const raw = this.decoder.line(line);
    if (raw === undefined) return undefined;
    const [name, eid, data] = raw;
    let parsed: unknown;
    try {
      parsed = data ? JSON.parse(data) : {};
    } catch {
      throw new StreamError(`event ${JSON.stringify(name)} carries data that is not JSON`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new StreamError(`event ${JSON.stringify(name)} carries data that is not a JSON object`);
    }
    const obj = parsed as Record<string, any>;
    if (eid !== undefined) this.lastEventId = eid;
    const ev: RunEvent = { event: name, id: eid ?? "", data: obj };
    if (name === "stdout" || name === "stderr") {
      const seen = this.offsets[name];
      const offset = Number(obj["offset"] ?? 0);
      const end = offset + Number(obj["bytes"] ?? 0);
      if (seen !== undefined && end <= seen) return undefined; // sent before the reconnect: already handed out
      if (seen !== undefined && offset > seen) {
        throw new StreamError(`${name} of run ${this.requestId}: got bytes from ${offset}, expected ${seen}`);
      }
      this.offsets[name] = end;
    }
    if (name === "ended") this.ended = true;
    return ev;
  }

  /** The connection ended: returns to reconnect, or throws when it may not. */
  dropped(error: unknown): void {
    if (this.ended) return;
    if (error instanceof APIError) throw error;
    this.reconnects += 1;
    if (this.reconnects > this.maxReconnects) {
      const why = error instanceof Error ? error.message : "closed before `ended`";
      throw new StreamError(`the event stream of run ${this.requestId} broke ${this.reconnects} times (last: ${why})`);
    }
  }
}
