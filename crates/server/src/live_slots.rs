//! The live sessions' sandboxes held on this node (the registry in the shared state; what
//! they do is crate::execution::live): per session a slot, locked for the length of a cell,
//! its idle end or its close, holding the live sandbox's control connection and run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

/// The live sandboxes on this node, by session id.
#[derive(Default)]
pub struct LiveSessions(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>);

impl LiveSessions {
    /// The session's slot (made on first use): held for the length of a cell, so that a
    /// session's cells, its idle end and its close never overlap.
    pub fn slot(&self, session_id: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(session_id.to_owned()).or_default().clone()
    }

    /// The session's slot, if it has one (a close does not make one).
    pub fn get(&self, session_id: &str) -> Option<Arc<tokio::sync::Mutex<Slot>>> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(session_id).cloned()
    }

    /// Whether no session has a slot on this node.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// The sessions with a slot on this node.
    pub fn ids(&self) -> Vec<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.keys().cloned().collect()
    }

    /// Drops the slots nobody holds or waits for and that hold no sandbox (their sessions'
    /// interpreters ended: idle, lost or on another executor now), so that the registry does
    /// not grow with every session this node ever held, and an executor with none claims no
    /// held cells. A slot is held by every cell, idle watcher and close that uses it (each
    /// keeps a clone), so one that only the registry holds is in no one's hands; a later
    /// cell makes a fresh one.
    pub fn prune(&self) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |s| s.live.is_some())
        });
    }

    /// Drops the session's slot (its sandbox ended with its close).
    pub fn forget(&self, session_id: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(session_id);
    }
}

/// A session's live sandbox, if it has one up.
#[derive(Default)]
pub struct Slot {
    pub live: Option<Live>,
    /// Sandboxes started for the session so far (by this process).
    pub(crate) generation: u64,
}

/// A live sandbox: the control connection and the run that holds it.
pub struct Live {
    pub(crate) conn: tokio::net::UnixStream,
    /// Kills the interpreter's runner (and so its sandbox).
    pub(crate) cancel: CancellationToken,
    pub(crate) run: tokio::task::JoinHandle<()>,
    /// The interpreter run's request id.
    pub request_id: String,
    pub(crate) last: Instant,
    pub(crate) generation: u64,
    /// The last cell's number on the channel (echoed by the driver's answer).
    pub(crate) seq: u64,
}

impl Live {
    /// Whether its run has ended (the runner exited or was lost).
    pub fn ended(&self) -> bool {
        self.run.is_finished()
    }
}

impl Slot {
    /// The generation number of the next sandbox.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn prune_drops_only_slots_in_no_ones_hands() {
        let live = LiveSessions::default();
        let held = live.slot("ses_held");
        let locked = live.slot("ses_locked");
        let guard = locked.clone().lock_owned().await;
        drop(locked);
        drop(live.slot("ses_free"));
        live.prune();
        let mut ids = live.ids();
        ids.sort();
        assert_eq!(ids, ["ses_held", "ses_locked"]);
        drop(guard);
        drop(held);
        live.prune();
        assert!(live.is_empty());
    }
}
