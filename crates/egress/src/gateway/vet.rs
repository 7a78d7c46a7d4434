//! Checking a destination and connecting to it: the allowlist, the DNS lookup within the
//! connect timeout, the address rules for every resolved address (the gateway host's own
//! included), then a connection to one of the vetted addresses.

use std::net::{IpAddr, SocketAddr};

use hyper::StatusCode;
use tokio::net::TcpStream;

use crate::addr::canonical;
use crate::decision::sanitize;
use crate::host::{Host, Target, TargetError};

use super::shared::Shared;

/// A refused check: the status to answer with and why.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) reason: String,
    pub(super) address: Option<IpAddr>,
}

impl Refusal {
    fn forbidden(reason: String) -> Refusal {
        Refusal {
            status: StatusCode::FORBIDDEN,
            reason,
            address: None,
        }
    }
}

pub(super) struct Vetted {
    pub(super) addrs: Vec<IpAddr>,
    pub(super) reason: String,
}

impl Shared {
    /// Policy match, resolution, and the address check of every resolved address.
    pub(super) async fn vet(&self, t: &Target) -> Result<Vetted, Refusal> {
        let rule = self
            .policy
            .match_target(t)
            .map_err(|e| Refusal::forbidden(e.to_string()))?;
        let raw = match &t.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(n) => {
                match tokio::time::timeout(self.limits.connect_timeout, self.resolver.resolve(n))
                    .await
                {
                    Err(_) => {
                        return Err(Refusal {
                            status: StatusCode::BAD_GATEWAY,
                            reason: format!("DNS lookup of {n} timed out"),
                            address: None,
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Refusal {
                            status: StatusCode::BAD_GATEWAY,
                            reason: sanitize(&e.to_string(), 200),
                            address: None,
                        });
                    }
                    Ok(Ok(a)) => a,
                }
            }
        };
        let mut addrs: Vec<IpAddr> = Vec::with_capacity(raw.len());
        for ip in raw.into_iter().map(canonical) {
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
        if addrs.is_empty() {
            return Err(Refusal {
                status: StatusCode::BAD_GATEWAY,
                reason: format!("{} has no addresses", t.host),
                address: None,
            });
        }
        // The host's own addresses as of now (they can change while the gateway runs; the
        // cache is refreshed on every address event the kernel reports).
        let own = self.own.current();
        let mut note = None;
        for ip in &addrs {
            match self.policy.check_address_own(*ip, &own) {
                Ok(None) => {}
                Ok(Some(n)) => {
                    note.get_or_insert(n);
                }
                Err(r) => {
                    let reason = match &t.host {
                        Host::Name(n) => format!("{n} resolves to a blocked {r}"),
                        Host::Ip(_) => format!("blocked {r}"),
                    };
                    return Err(Refusal {
                        status: StatusCode::FORBIDDEN,
                        reason,
                        address: Some(*ip),
                    });
                }
            }
        }
        // IPv4 first: a sandbox host without IPv6 routes should not wait on AAAA answers.
        addrs.sort_by_key(|ip| !ip.is_ipv4());
        let reason = match note {
            None => format!("allowed by rule {rule}"),
            Some(n) => format!("allowed by rule {rule}; {n}"),
        };
        Ok(Vetted { addrs, reason })
    }

    /// Connects to the vetted addresses in order, within the connect timeout.
    /// Everything between a parsed destination and a connected upstream for a CONNECT (a
    /// forwarded request does the same steps itself, to reuse a pooled connection): the allowlist and address checks, the run's budgets, and a
    /// connection to one of the vetted addresses. Returns the stream, the address and the rule.
    pub(super) async fn open(&self, t: &Target) -> Result<(TcpStream, IpAddr, String), Refusal> {
        let vetted = self.vet(t).await?;
        if let Some(what) = self.budget.exhausted() {
            return Err(Refusal::forbidden(format!("{what} budget already used up")));
        }
        let (upstream, addr) = self.connect(&vetted.addrs, t.port).await?;
        Ok((upstream, addr, vetted.reason))
    }

    pub(super) async fn connect(
        &self,
        addrs: &[IpAddr],
        port: u16,
    ) -> Result<(TcpStream, IpAddr), Refusal> {
        let deadline = tokio::time::Instant::now() + self.limits.connect_timeout;
        let mut last = Refusal {
            status: StatusCode::BAD_GATEWAY,
            reason: "no address to connect to".into(),
            address: None,
        };
        for ip in addrs {
            let sa = SocketAddr::new(*ip, port);
            match tokio::time::timeout_at(deadline, TcpStream::connect(sa)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, *ip));
                }
                Ok(Err(e)) => {
                    last = Refusal {
                        status: StatusCode::BAD_GATEWAY,
                        reason: format!("connect to {sa} failed: {e}"),
                        address: Some(*ip),
                    };
                }
                Err(_) => {
                    return Err(Refusal {
                        status: StatusCode::GATEWAY_TIMEOUT,
                        reason: format!("connect to {sa} timed out"),
                        address: Some(*ip),
                    });
                }
            }
        }
        Err(last)
    }
}

/// Host text recorded for a destination that could not be parsed: never userinfo.
pub(super) fn recorded_host(raw: &str, err: &TargetError) -> String {
    match err {
        TargetError::Userinfo => String::new(),
        _ => sanitize(raw, 255),
    }
}

pub(super) fn target_refusal_status(err: &TargetError) -> StatusCode {
    match err {
        TargetError::Userinfo => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    }
}
