//! Following a run as it happens (`GET /v1/runs/{request_id}/events`, Server-Sent Events):
//! `queued`, `started`, `stdout` / `stderr` chunks, a `denial` for each distinct refusal as it
//! happens (the first 64: [`crate::execution::denials`]), and `ended` with the final record.
//!
//! Nothing is pushed and nothing is buffered per client: each follower looks at the store for
//! the run's state and reads the logs and the denials from where it left off (this node's job
//! folder, or the store's copy when it keeps logs), a bounded amount per look. It looks when
//! the run's execution tells it something changed, if the run executes on this node
//! ([`crate::news`]; at most every [`MIN_GAP`], so that a command printing a byte at
//! a time cannot make its followers spin), and otherwise every [`POLL`]. A follower that
//! does not read holds one poll's worth at most and no run slot; one that disconnects resumes
//! with its `Last-Event-ID`, which is its position
//! (`PHASE.STDOUT_OFFSET.STDERR_OFFSET.DENIALS_OFFSET`), so no chunk or denial is lost or sent
//! twice. Chunks are the sandbox's bytes as text, with the task's secrets masked (a copy of a
//! secret across two polls is held back until it is seen whole) and made inert for a terminal,
//! like the record's views; so is a denial's detail. `ended` carries the record (whose views,
//! digests and denials are the run's final word).

use std::time::{Duration, Instant};

use agentjail_manifest::report::DenialKind;

use super::failure::Failure;
use super::runs::{RunView, get_checked, view};
use crate::app::AppState;
use crate::execution::denials;
use crate::execution::streams::{self, Secrets};
use crate::news::Listener;
use crate::policy::{Caller, Refusal};
use crate::storage::db::RunFilter;

/// How often a follower looks for news of a run that does not execute on this node.
pub const POLL: Duration = Duration::from_millis(200);
/// How long a follower of a run executing on this node waits for a wake-up before it looks
/// anyway (the run's state can also change elsewhere: an operator, another node).
const NEWS_FALLBACK: Duration = Duration::from_secs(2);
/// The shortest time between two looks of a follower woken by news.
pub const MIN_GAP: Duration = Duration::from_millis(20);
/// Most bytes of one stream sent in one chunk event.
pub const CHUNK_BYTES: usize = 16 * 1024;
/// Most bytes of one stream read per poll (so a follower far behind catches up in steps).
const POLL_BYTES: u64 = 64 * 1024;
/// A follower ends after this long whatever the run does (it reconnects with its position).
const MAX_FOLLOW: Duration = Duration::from_secs(3600);

/// Where a follower is: what it has been sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// 0 nothing, 1 `queued` sent, 2 `started` sent, 3 `ended` sent.
    pub phase: u8,
    pub stdout: u64,
    pub stderr: u64,
    /// Bytes of the run's `denials.jsonl` sent (whole lines).
    pub denials: u64,
}

impl Position {
    /// The SSE event id: `PHASE.STDOUT.STDERR.DENIALS`.
    pub fn id(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.phase, self.stdout, self.stderr, self.denials
        )
    }

    /// A `Last-Event-ID`; None when it is not one of ours (the follower starts over). The
    /// three-part id of the versions before the denials (`PHASE.STDOUT.STDERR`) is taken as
    /// no denial sent yet.
    pub fn parse(s: &str) -> Option<Position> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        if !(3..=4).contains(&parts.len()) {
            return None;
        }
        let number = |i: usize| parts.get(i).map_or(Some(0), |p| p.parse::<u64>().ok());
        Some(Position {
            phase: parts[0].parse::<u8>().ok().filter(|p| *p <= 3)?,
            stdout: number(1)?,
            stderr: number(2)?,
            denials: number(3)?,
        })
    }
}

/// One event of a run.
#[derive(Debug)]
pub enum RunEvent {
    Queued,
    Started,
    /// Text of `bytes` bytes of a stream from `offset`.
    Chunk {
        stream: &'static str,
        offset: u64,
        bytes: u64,
        text: String,
    },
    /// A refusal, as it happened: its kind and detail as the record's denials name them (the
    /// detail with the task's secrets masked, made inert).
    Denial {
        kind: DenialKind,
        detail: String,
    },
    Ended(Box<RunView>),
}

/// A follower of one run.
pub struct Follow {
    state: AppState,
    tenant: String,
    request_id: String,
    job_id: String,
    secrets: Secrets,
    margin: usize,
    /// Which streams the task shows at all ([stdout, stderr]): a stream whose budget is 0
    /// never leaves, live or not.
    shown: [bool; 2],
    pub position: Position,
    since: Instant,
    done: bool,
    /// The news of the run's execution on this node, when it executes here.
    news: Option<Listener>,
    /// The execution here is over (its news closed): no use listening again for this job id.
    news_over: bool,
    /// When the last look began.
    looked: Option<Instant>,
}

/// Starts following `request_id` of the caller's tenant (audited as `run_events`), from
/// `resume` (a `Last-Event-ID`) when given.
pub(crate) async fn follow(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    resume: Option<Position>,
) -> Result<Follow, Failure> {
    let r = get_checked(state, caller, request_id, "run_events", |_| Ok(())).await?;
    Follow::of(state, r, resume)
}

/// Follows a run the caller is waiting for in the same call (MCP's live progress of a tool
/// call): not audited again, since the call itself is. None until the run is recorded.
pub(crate) async fn follow_own_call(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<Option<Follow>, Failure> {
    match state.store().get_run(&caller.tenant, request_id).await? {
        Some(r) => Follow::of(state, r, None).map(Some),
        None => Ok(None),
    }
}

/// Follows the run the caller has just submitted in the same request (`POST /v1/runs` asking
/// for `text/event-stream`), from its record as the submission returned it: no second read,
/// and no record of its own in the audit chain, since the submission's covers it.
pub(crate) fn follow_submitted(
    state: &AppState,
    r: crate::storage::db::RunRow,
) -> Result<Follow, Failure> {
    Follow::of(state, r, None)
}

impl Follow {
    fn of(
        state: &AppState,
        r: crate::storage::db::RunRow,
        resume: Option<Position>,
    ) -> Result<Follow, Failure> {
        let Some(task) = state.inner.config.tasks.get(&r.task) else {
            return Err(Failure::Refused(Refusal::TaskGone));
        };
        let secrets = Secrets::of(task);
        Ok(Follow {
            shown: [task.stdout_limit() > 0, task.stderr_limit() > 0],
            margin: secrets.longest(),
            secrets,
            state: state.clone(),
            tenant: r.tenant,
            request_id: r.request_id,
            job_id: r.job_id,
            position: resume.unwrap_or_default(),
            since: Instant::now(),
            done: false,
            news: None,
            news_over: false,
            looked: None,
        })
    }

    /// The next events (and the position after each); empty when the follow has ended.
    /// Waits for news, a look at a time.
    pub async fn next(&mut self) -> Result<Vec<(RunEvent, Position)>, Failure> {
        loop {
            if self.done || self.since.elapsed() > MAX_FOLLOW {
                return Ok(Vec::new());
            }
            let out = self.poll().await?;
            if !out.is_empty() {
                return Ok(out);
            }
            self.wait(NEWS_FALLBACK).await;
        }
    }

    /// Waits until the run's execution on this node has news (at most `max`), or [`POLL`]
    /// when it does not execute here.
    pub async fn wait(&mut self, max: Duration) {
        let Some(news) = self.news.as_mut() else {
            tokio::time::sleep(POLL).await;
            return;
        };
        if let Ok(false) = tokio::time::timeout(max, news.changed()).await {
            // The execution here is over (its end recorded): the next look finds it; any
            // later one polls.
            self.news = None;
            self.news_over = true;
        }
    }

    /// One look for news (what [`Follow::next`] repeats until there is some), at least
    /// [`MIN_GAP`] after the last one began.
    pub async fn poll(&mut self) -> Result<Vec<(RunEvent, Position)>, Failure> {
        if let Some(gap) = self.looked.and_then(|t| MIN_GAP.checked_sub(t.elapsed())) {
            tokio::time::sleep(gap).await;
        }
        // Listening before the look: what changes after it began wakes the next wait.
        if self.news.is_none() && !self.news_over {
            self.news = self.state.inner.news.listen(&self.job_id);
        }
        self.looked = Some(Instant::now());
        metrics::counter!("agentjail_follower_looks_total").increment(1);
        let mut out = Vec::new();
        // The run's state only, not its outputs (an artifact can be megabytes): the record is
        // read once, for `ended`.
        let filter = RunFilter {
            tenant: Some(self.tenant.clone()),
            request_id: Some(self.request_id.clone()),
            limit: 1,
            ..RunFilter::default()
        };
        let Some(r) = self.state.store().list_runs(filter).await?.pop() else {
            self.done = true;
            return Ok(out);
        };
        // A retried run (a new job id) is followed from its start.
        if r.job_id != self.job_id {
            self.job_id = r.job_id.clone();
            self.position = Position::default();
            self.news = self.state.inner.news.listen(&self.job_id);
            self.news_over = false;
        }
        let ended = r.status.is_terminal();
        if self.position.phase < 1 {
            self.position.phase = 1;
            out.push((RunEvent::Queued, self.position));
        }
        if self.position.phase < 2 && r.started_at.is_some() {
            self.position.phase = 2;
            out.push((RunEvent::Started, self.position));
        }
        let mut caught_up = true;
        for stdout in [true, false] {
            if !self.shown[usize::from(!stdout)] {
                continue;
            }
            let offset = if stdout {
                self.position.stdout
            } else {
                self.position.stderr
            };
            // Read with the secret-length context before `offset` (already sent), so that a
            // secret across the last cut is seen whole again and its rest masked too.
            let ctx_from = offset.saturating_sub(self.margin as u64);
            let Some(window) = self.read(stdout, ctx_from).await? else {
                continue;
            };
            let ctx = (offset - ctx_from) as usize;
            if window.len() <= ctx {
                continue;
            }
            let mut masked = window;
            self.secrets.mask(&mut masked);
            let masked = masked.split_off(ctx);
            // Held back while the run goes on (or the read was cut): the end of a secret, or
            // of a character, may still be on its way.
            let mut send = masked.len();
            if !ended || (ctx + masked.len()) as u64 >= POLL_BYTES {
                send = send.saturating_sub(self.margin);
                while send > 0 && send < masked.len() && (masked[send] & 0xC0) == 0x80 {
                    send -= 1;
                }
            }
            if (ctx + masked.len()) as u64 >= POLL_BYTES {
                caught_up = false;
            }
            let mut at = 0;
            while at < send {
                let n = (send - at).min(CHUNK_BYTES);
                let mut end = at + n;
                while end > at + 1 && end < send && (masked[end] & 0xC0) == 0x80 {
                    end -= 1;
                }
                let text = streams::inert(&masked[at..end]);
                let start = offset + at as u64;
                if stdout {
                    self.position.stdout = start + (end - at) as u64;
                } else {
                    self.position.stderr = start + (end - at) as u64;
                }
                out.push((
                    RunEvent::Chunk {
                        stream: if stdout { "stdout" } else { "stderr" },
                        offset: start,
                        bytes: (end - at) as u64,
                        text,
                    },
                    self.position,
                ));
                at = end;
            }
        }
        // The denials recorded since (whole lines of `denials.jsonl`), once the sandbox started.
        let since = self.position.denials;
        if self.position.phase >= 2
            && let Some(b) = self.read_denials(since).await?
        {
            if b.len() as u64 >= POLL_BYTES {
                caught_up = false;
            }
            for (d, end) in denials::lines(&b) {
                self.position.denials = since + end as u64;
                // A line that is not a denial is passed over.
                if let Some(d) = d {
                    let detail = shown_detail(&self.secrets, d.detail);
                    out.push((
                        RunEvent::Denial {
                            kind: d.kind,
                            detail,
                        },
                        self.position,
                    ));
                }
            }
        }
        if ended && caught_up {
            let Some(record) = self
                .state
                .store()
                .get_run(&self.tenant, &self.request_id)
                .await?
            else {
                self.done = true;
                return Ok(out);
            };
            self.position.phase = 3;
            self.done = true;
            out.push((
                RunEvent::Ended(Box::new(view(&self.state, &record))),
                self.position,
            ));
        }
        Ok(out)
    }

    /// Up to [`POLL_BYTES`] of a log from `offset`: the store's copy when it keeps one, else
    /// this node's job folder (None: nothing there yet).
    async fn read(&self, stdout: bool, offset: u64) -> Result<Option<Vec<u8>>, Failure> {
        // The store's copy (PostgreSQL: appended by the executor as the run goes on), else
        // this node's job folder (the same bytes, where this node runs it).
        if let Some(b) = self
            .state
            .store()
            .run_log_since(&self.job_id, stdout, offset, POLL_BYTES)
            .await?
            .filter(|b| !b.is_empty())
        {
            return Ok(Some(b));
        }
        let path = crate::execution::runner::job_dir(&self.state, &self.job_id)
            .join(streams::log_name(stdout));
        Ok(streams::read_from(&path, offset, POLL_BYTES).filter(|b| !b.is_empty()))
    }

    /// [`Follow::read`] for the run's live denials (`denials.jsonl`).
    async fn read_denials(&self, offset: u64) -> Result<Option<Vec<u8>>, Failure> {
        if let Some(b) = self
            .state
            .store()
            .run_denials_since(&self.job_id, offset, POLL_BYTES)
            .await?
            .filter(|b| !b.is_empty())
        {
            return Ok(Some(b));
        }
        let path = crate::execution::runner::job_dir(&self.state, &self.job_id).join(denials::NAME);
        Ok(streams::read_from(&path, offset, POLL_BYTES).filter(|b| !b.is_empty()))
    }
}

/// A denial's detail as a follower sees it: the task's secrets masked, made inert.
fn shown_detail(secrets: &Secrets, detail: String) -> String {
    let mut b = detail.into_bytes();
    secrets.mask(&mut b);
    streams::inert(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_refuse_what_is_not_ours() {
        let p = Position {
            phase: 2,
            stdout: 17,
            stderr: 0,
            denials: 38,
        };
        assert_eq!(p.id(), "2.17.0.38");
        assert_eq!(Position::parse(&p.id()), Some(p));
        // The three-part id of a follower from before the denials: none sent yet.
        assert_eq!(
            Position::parse(" 2.17.0 "),
            Some(Position { denials: 0, ..p })
        );
        for bad in [
            "",
            "4.0.0",
            "1.x.0",
            "1.2",
            "a.b.c",
            "1.2.3.4.5",
            "1.2.3.x",
            "1.2.3.",
            "1.2.3.-1",
            "1..3.4",
        ] {
            assert_eq!(Position::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_denial_detail_is_masked_and_inert() {
        let s = Secrets::from_values(&["sk-secret-1234"]);
        let shown = shown_detail(&s, "GET sk-secret-1234.test:443: \x1b[2Jnot allowed".into());
        assert!(
            !shown.contains("sk-secret") && !shown.contains('\x1b'),
            "{shown}"
        );
        assert!(
            shown.starts_with("GET **************.test:443: \\x1b[2J"),
            "{shown}"
        );
    }
}
