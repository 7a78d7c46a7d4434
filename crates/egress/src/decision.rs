//! The decision log: one entry per allowed or refused connection or request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// One decision of the gateway.
///
/// It holds no payload, no header value, no URL path or query and no credential: only the
/// method, the normalised host and port, the address connected to, a reason written by the
/// gateway, byte counts and times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Whether the connection or request was let through.
    pub allowed: bool,
    /// `CONNECT`, `GET`, `POST`, ... (methods other than the standard ones are recorded as
    /// `OTHER`); empty when the gateway refused before reading a request.
    pub method: String,
    /// Normalised host (lowercase punycode name or IP address); empty if there was none or it
    /// could not be parsed.
    pub host: String,
    /// Destination port (0 if unknown).
    pub port: u16,
    /// The address the gateway connected to, or the address that caused a refusal.
    pub address: Option<IpAddr>,
    /// Why: the matching rule, or the refusal reason.
    pub reason: String,
    /// Bytes sent towards the destination (request line and headers counted approximately
    /// for plain HTTP).
    pub bytes_up: u64,
    /// Bytes received from the destination.
    pub bytes_down: u64,
    /// When the decision started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// How long the connection or request lasted, in milliseconds.
    pub duration_ms: u64,
    /// How many decisions this entry stands for: refusals with the same method, host, port
    /// and reason are merged into the first one (its times and address are the first's).
    /// Allowed connections are never merged (1). In a [`LOG_FULL`] entry: how many decisions
    /// were not logged.
    pub count: u64,
}

/// The reason of the entry that counts what the log did not keep once full: at most
/// [`MAX_ALLOWED`] allowed and [`MAX_REFUSALS`] distinct refusals are kept, so that a payload
/// that floods the gateway with requests (each to another host) cannot make the log, the report
/// or the work after the run grow with it. Such an entry has an empty method and host, port 0,
/// `allowed` telling which kind it counts, and the number in `count`.
pub const LOG_FULL: &str = "decision log full: not listed";
/// Most allowed connections kept in the log (each run allows at most
/// `limits.network_connections` connections, up to 10 000; plain-HTTP requests on kept-alive
/// connections can be more).
pub const MAX_ALLOWED: usize = 1024;
/// Most distinct refusals kept in the log (the report lists at most as many per kind).
pub const MAX_REFUSALS: usize = 256;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Methods recorded verbatim; anything else is `OTHER` (a method is client-chosen text).
pub(crate) fn method_name(m: &hyper::Method) -> String {
    const KNOWN: &[&str] = &[
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    let s = m.as_str();
    if KNOWN.contains(&s) {
        s.to_owned()
    } else {
        "OTHER".to_owned()
    }
}

/// Makes text safe to log and to put in a header: printable ASCII, bounded length.
pub(crate) fn sanitize(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(max)
        .collect();
    if s.chars().count() > max {
        out.push_str("...");
    }
    out
}

/// Told of each refusal the log keeps, as it is made (its first occurrence: a refusal merged
/// into a kept one, or past [`MAX_REFUSALS`], is not told). Called on the gateway's thread,
/// with no lock of the log held.
pub type RefusalObserver = Arc<dyn Fn(&Decision) + Send + Sync>;

/// The shared, append-only log: bounded in entries whatever the payload does, and O(1) per
/// decision (refusals are merged through a map keyed by method, host, port and reason).
#[derive(Default)]
pub(crate) struct Log {
    inner: Mutex<Entries>,
    observer: OnceLock<RefusalObserver>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("inner", &self.inner)
            .field("observed", &self.observer.get().is_some())
            .finish()
    }
}

#[derive(Debug, Default)]
struct Entries {
    list: Vec<Decision>,
    /// Index in `list` of each kept refusal, by (method, host, port, reason).
    refusals: HashMap<(String, String, u16, String), usize>,
    allowed: usize,
    dropped_allowed: u64,
    dropped_refusals: u64,
}

impl Entries {
    /// Keeps or counts `d`; true when it is a refusal kept as a new entry.
    fn push(&mut self, d: Decision) -> bool {
        if d.allowed {
            if self.allowed >= MAX_ALLOWED {
                self.dropped_allowed = self.dropped_allowed.saturating_add(d.count);
                return false;
            }
            self.allowed += 1;
            self.list.push(d);
            return false;
        }
        let key = (d.method.clone(), d.host.clone(), d.port, d.reason.clone());
        if let Some(&i) = self.refusals.get(&key) {
            if let Some(e) = self.list.get_mut(i) {
                e.count = e.count.saturating_add(d.count);
            }
            return false;
        }
        if self.refusals.len() >= MAX_REFUSALS {
            self.dropped_refusals = self.dropped_refusals.saturating_add(d.count);
            return false;
        }
        self.refusals.insert(key, self.list.len());
        self.list.push(d);
        true
    }

    fn take(&mut self) -> Vec<Decision> {
        let mut out = std::mem::take(&mut self.list);
        for (allowed, count) in [(true, self.dropped_allowed), (false, self.dropped_refusals)] {
            if count > 0 {
                out.push(Decision {
                    allowed,
                    method: String::new(),
                    host: String::new(),
                    port: 0,
                    address: None,
                    reason: LOG_FULL.into(),
                    bytes_up: 0,
                    bytes_down: 0,
                    started_ms: now_ms(),
                    duration_ms: 0,
                    count,
                });
            }
        }
        *self = Entries::default();
        out
    }
}

impl Log {
    pub(crate) fn push(&self, d: Decision) {
        tracing::debug!(
            allowed = d.allowed,
            method = %d.method,
            host = %d.host,
            port = d.port,
            reason = %d.reason,
            "egress decision"
        );
        let observer = self.observer.get();
        let told = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let kept = g.push(d);
            // A copy of the new entry, told once the lock is released.
            match observer {
                Some(_) if kept => g.list.last().cloned(),
                _ => None,
            }
        };
        if let (Some(f), Some(d)) = (observer, told) {
            f(&d);
        }
    }

    /// Tells `f` of each refusal kept from now on (the first observer set stays).
    pub(crate) fn observe(&self, f: RefusalObserver) {
        let _ = self.observer.set(f);
    }

    /// The kept decisions in the order they were first made, then at most two [`LOG_FULL`]
    /// entries counting what was not kept; the log is empty afterwards.
    pub(crate) fn take(&self) -> Vec<Decision> {
        match self.inner.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_bounds_and_strips() {
        assert_eq!(sanitize("abc", 10), "abc");
        assert_eq!(sanitize("a\r\nb\u{e9}", 10), "a??b?");
        assert_eq!(sanitize("abcdef", 3), "abc...");
    }

    fn refusal(host: &str, reason: &str) -> Decision {
        Decision {
            allowed: false,
            method: "GET".into(),
            host: host.into(),
            port: 80,
            address: None,
            reason: reason.into(),
            bytes_up: 0,
            bytes_down: 0,
            started_ms: 0,
            duration_ms: 0,
            count: 1,
        }
    }

    #[test]
    fn refusals_are_merged_and_the_log_is_bounded() {
        let log = Log::default();
        for _ in 0..1000 {
            log.push(refusal("same.test", "forbidden"));
        }
        for i in 0..100_000 {
            log.push(refusal(&format!("h{i}.test"), "forbidden"));
        }
        for _ in 0..(MAX_ALLOWED + 5) {
            log.push(Decision {
                allowed: true,
                ..refusal("ok.test", "rule")
            });
        }
        let got = log.take();
        assert_eq!(got.len(), MAX_REFUSALS + MAX_ALLOWED + 2);
        assert_eq!(got[0].host, "same.test");
        assert_eq!(got[0].count, 1000);
        let full: Vec<&Decision> = got.iter().filter(|d| d.reason == LOG_FULL).collect();
        assert_eq!(full.len(), 2);
        assert!(full.iter().any(|d| d.allowed && d.count == 5));
        let kept: u64 = got
            .iter()
            .filter(|d| !d.allowed && d.reason != LOG_FULL)
            .map(|d| d.count)
            .sum();
        assert!(full.iter().any(|d| !d.allowed && d.count + kept == 101_000));
        assert!(log.take().is_empty());
    }

    #[test]
    fn the_observer_is_told_each_kept_refusal_once() {
        let log = Log::default();
        let told = Arc::new(Mutex::new(Vec::new()));
        let to = told.clone();
        log.observe(Arc::new(move |d: &Decision| {
            to.lock().unwrap().push(d.host.clone())
        }));
        log.push(refusal("a.test", "forbidden"));
        log.push(refusal("a.test", "forbidden"));
        log.push(Decision {
            allowed: true,
            ..refusal("ok.test", "rule")
        });
        for i in 0..(MAX_REFUSALS + 10) {
            log.push(refusal(&format!("h{i}.test"), "forbidden"));
        }
        let told = told.lock().unwrap();
        assert_eq!(told.len(), MAX_REFUSALS);
        assert_eq!(told[0], "a.test");
        assert_eq!(told[1], "h0.test");
    }

    #[test]
    fn unknown_methods_are_not_echoed() {
        let m = hyper::Method::from_bytes(b"SECRETMETHOD").unwrap();
        assert_eq!(method_name(&m), "OTHER");
        assert_eq!(method_name(&hyper::Method::GET), "GET");
    }
}
