//! Live progress of a tool call that sent a `progressToken`: what the run printed, as it prints
//! it, the sandbox's refusals as they happen (`denial: KIND: DETAIL`), and where it is
//! (`queued`, `started`, the time spent of the task's limit).
//!
//! Output goes in the progress notifications' `message`, not in `notifications/message`: MCP
//! logging is deprecated by the 2026-07-28 revision (SEP-2577), and a progress notification
//! rides the call's own response stream (Streamable HTTP routes it by its token), so only the
//! client that made the call sees it. The text is the SSE stream's ([`service::follow`]): the
//! sandbox's bytes with the task's secrets masked and made inert, a stream whose budget is 0
//! never sent. Bounded: [`LIVE_BYTES`] of output per call, then one note; a message every
//! [`service::events::MIN_GAP`] at most per stream chunk (a run on another node: every
//! [`service::events::POLL`]), and a status line each second otherwise.

use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;

use crate::app::AppState;
use crate::service::{self, Caller, RunEvent};

/// Most bytes of the run's output sent live in one call's progress messages (the result then
/// carries the head and tail of each stream, and `/v1/runs/{id}/logs` the rest).
pub(super) const LIVE_BYTES: usize = 256 * 1024;
/// Most bytes of text in one progress message.
const MESSAGE_BYTES: usize = 4096;
/// A status line when nothing else was sent for this long.
const TICK: Duration = Duration::from_secs(1);

/// Sends progress for `request_id` until the run ends or the peer is gone; the caller aborts
/// the task when its call returns.
pub(super) async fn live(
    state: AppState,
    caller: Caller,
    request_id: String,
    limit_secs: u64,
    token: ProgressToken,
    peer: Peer<RoleServer>,
) {
    let started = Instant::now();
    let mut p = Progress {
        token,
        peer,
        started,
        last: 0.0,
        limit_secs,
    };
    let mut follow = None;
    let mut status = "queued";
    let mut sent = 0usize;
    let mut last_message = started;
    loop {
        if follow.is_none() {
            follow = service::follow_own_call(&state, &caller, &request_id)
                .await
                .ok()
                .flatten();
        }
        let events = match follow.as_mut() {
            Some(f) => f.poll().await.unwrap_or_default(),
            None => Vec::new(),
        };
        let mut messages = Vec::new();
        for (ev, _) in events {
            match ev {
                RunEvent::Queued => status = "queued",
                RunEvent::Started => {
                    status = "running";
                    messages.push("started".to_string());
                }
                RunEvent::Chunk { stream, text, .. } => {
                    if sent >= LIVE_BYTES {
                        continue;
                    }
                    let room = LIVE_BYTES - sent;
                    let mut text = text.as_str();
                    let cut = text.len() > room;
                    if cut {
                        text = &text[..floor_char(text, room)];
                    }
                    sent += text.len();
                    let mut rest = text;
                    while !rest.is_empty() {
                        let n = floor_char(rest, MESSAGE_BYTES).max(first_char(rest));
                        messages.push(format!("{stream}: {}", &rest[..n]));
                        rest = &rest[n..];
                    }
                    if cut {
                        sent = LIVE_BYTES;
                        messages.push(format!(
                            "further output is not sent live (over {} KiB): the result carries \
                             the head and tail of each stream",
                            LIVE_BYTES / 1024
                        ));
                    }
                }
                // A refusal as it happens (the result's report has them all).
                RunEvent::Denial { kind, detail } => {
                    let kind = serde_json::to_value(kind).unwrap_or_default();
                    messages.push(format!("denial: {}: {detail}", kind.as_str().unwrap_or("")));
                }
                // The call's result follows: nothing more to say.
                RunEvent::Ended(_) => return,
            }
        }
        if messages.is_empty() && last_message.elapsed() >= TICK {
            messages.push(format!(
                "{status}; {:.0} s elapsed of the task's {limit_secs} s limit",
                started.elapsed().as_secs_f64()
            ));
        }
        for m in messages {
            if !p.send(m).await {
                return;
            }
            last_message = Instant::now();
        }
        // Until the run has news (on this node: as it happens; elsewhere: the next poll), or
        // the next status line is due.
        match follow.as_mut() {
            Some(f) => f.wait(TICK.saturating_sub(last_message.elapsed())).await,
            None => tokio::time::sleep(service::events::POLL).await,
        }
    }
}

struct Progress {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    started: Instant,
    /// The last progress value sent: each one must be greater (MCP requires an increase).
    last: f64,
    limit_secs: u64,
}

impl Progress {
    /// One notification; false when the peer is gone. `progress` is the seconds elapsed,
    /// `total` the task's limit.
    async fn send(&mut self, message: String) -> bool {
        let now = self.started.elapsed().as_secs_f64().max(self.last + 0.001);
        self.last = now;
        let p = ProgressNotificationParam::new(self.token.clone(), now)
            .with_total(self.limit_secs as f64)
            .with_message(message);
        self.peer.notify_progress(p).await.is_ok()
    }
}

/// The largest char boundary of `s` at or below `n`.
fn floor_char(s: &str, n: usize) -> usize {
    let mut n = n.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The length of `s`'s first character (so a message always advances).
fn first_char(s: &str) -> usize {
    s.chars().next().map_or(0, char::len_utf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_on_characters() {
        let s = "aé€😀";
        for n in 0..=s.len() {
            assert!(s.is_char_boundary(floor_char(s, n)), "{n}");
        }
        assert_eq!(floor_char(s, 2), 1);
        assert_eq!(first_char("😀x"), 4);
        assert_eq!(first_char(""), 0);
    }
}
