//! The decision log: one entry per allowed or refused connection or request.

use std::net::IpAddr;
use std::sync::Mutex;
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
}

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

/// The shared, append-only log.
#[derive(Debug, Default)]
pub(crate) struct Log {
    entries: Mutex<Vec<Decision>>,
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
        match self.entries.lock() {
            Ok(mut g) => g.push(d),
            Err(poisoned) => poisoned.into_inner().push(d),
        }
    }

    pub(crate) fn take(&self) -> Vec<Decision> {
        match self.entries.lock() {
            Ok(mut g) => std::mem::take(&mut *g),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
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

    #[test]
    fn unknown_methods_are_not_echoed() {
        let m = hyper::Method::from_bytes(b"SECRETMETHOD").unwrap();
        assert_eq!(method_name(&m), "OTHER");
        assert_eq!(method_name(&hyper::Method::GET), "GET");
    }
}
