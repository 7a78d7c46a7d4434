//! The compiled allowlist: rules normalised once, matched many times.

use std::net::IpAddr;

use agentjail_manifest::EgressPolicy;
use ipnet::IpNet;

use crate::addr::{canonical, classify};
use crate::host::{Host, Target, parse_host};

/// A manifest `network` policy that could not be compiled. One line, naming the bad entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The host of an allow rule is not a valid name, wildcard or IP address.
    #[error("network.allow[{index}]: host {host:?} is invalid: {reason}")]
    BadHost {
        /// Index of the rule.
        index: usize,
        /// The host as written.
        host: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An allow rule without ports.
    #[error("network.allow[{index}]: host {host:?} lists no ports")]
    NoPorts {
        /// Index of the rule.
        index: usize,
        /// The host as written.
        host: String,
    },
    /// An allow rule with port 0.
    #[error("network.allow[{index}]: host {host:?}: port 0 is not a valid port")]
    PortZero {
        /// Index of the rule.
        index: usize,
        /// The host as written.
        host: String,
    },
    /// An allow rule naming a non-public IP that `allow_private` does not cover.
    #[error(
        "network.allow[{index}]: {ip} is a {class} address; it is only reachable if allow_private covers it"
    )]
    NonPublicIpRule {
        /// Index of the rule.
        index: usize,
        /// The address.
        ip: IpAddr,
        /// Its class.
        class: String,
    },
    /// An `allow_private` entry that is not an address or CIDR.
    #[error(
        "network.allow_private[{index}]: {cidr:?} is not an IP address or CIDR (e.g. 10.1.2.0/24)"
    )]
    BadCidr {
        /// Index of the entry.
        index: usize,
        /// The entry as written.
        cidr: String,
    },
    /// A `credentials` entry that cannot be used as written.
    #[error("network.credentials[{index}]: {reason}")]
    BadCredential {
        /// Index of the entry.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// `upstream_ca_file` without credentials, or not an absolute path.
    #[error("network.upstream_ca_file: {0}")]
    BadUpstreamCa(String),
    /// An `allow_private` entry with prefix length 0 (it would switch the address check off).
    #[error(
        "network.allow_private[{index}]: {cidr:?} covers every address and would disable the address check; list the ranges you need"
    )]
    TooBroad {
        /// Index of the entry.
        index: usize,
        /// The entry as written.
        cidr: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Exactly this normalised name.
    Exact(String),
    /// Any name ending in `.` + this suffix (one or more extra labels).
    Wildcard(String),
    /// Exactly this IP literal.
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    pattern: Pattern,
    ports: Vec<u16>,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pattern {
            Pattern::Exact(n) => f.write_str(n)?,
            Pattern::Wildcard(s) => write!(f, "*.{s}")?,
            Pattern::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]")?,
            Pattern::Ip(ip) => write!(f, "{ip}")?,
        }
        let ports: Vec<String> = self.ports.iter().map(|p| p.to_string()).collect();
        write!(f, ":{}", ports.join(","))
    }
}

/// A validated, normalised [`EgressPolicy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    rules: Vec<Rule>,
    allow_private: Vec<IpNet>,
}

/// Compiles (validates and normalises) a manifest egress policy.
///
/// Rule hosts get the same normalisation as requested hosts (UTS-46, lowercase, one trailing
/// dot stripped, IP literals in any form parsed as IPs). A rule host `*.suffix` matches names
/// with one or more labels in front of `suffix`, never `suffix` itself; the suffix must have at
/// least two labels (`*.com` is refused as too broad). Allow rules that name an IP address must
/// name a public one unless `allow_private` covers it.
pub fn compile_policy(p: &EgressPolicy) -> Result<CompiledPolicy, PolicyError> {
    let mut allow_private = Vec::with_capacity(p.allow_private.len());
    for (index, raw) in p.allow_private.iter().enumerate() {
        let text = raw.trim();
        let net = match text.parse::<IpNet>() {
            Ok(n) => n.trunc(),
            Err(_) => match text.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(canonical(ip)),
                Err(_) => {
                    return Err(PolicyError::BadCidr {
                        index,
                        cidr: raw.clone(),
                    });
                }
            },
        };
        if net.prefix_len() == 0 {
            return Err(PolicyError::TooBroad {
                index,
                cidr: raw.clone(),
            });
        }
        allow_private.push(net);
    }
    let mut rules = Vec::with_capacity(p.allow.len());
    for (index, rule) in p.allow.iter().enumerate() {
        let bad = |reason: String| PolicyError::BadHost {
            index,
            host: rule.host.clone(),
            reason,
        };
        if rule.ports.is_empty() {
            return Err(PolicyError::NoPorts {
                index,
                host: rule.host.clone(),
            });
        }
        if rule.ports.contains(&0) {
            return Err(PolicyError::PortZero {
                index,
                host: rule.host.clone(),
            });
        }
        let raw = rule.host.trim();
        if raw != rule.host {
            return Err(bad("leading or trailing whitespace".into()));
        }
        let pattern = if let Some(suffix) = raw.strip_prefix("*.") {
            match parse_host(suffix) {
                Ok(Host::Name(n)) if n.contains('.') => Pattern::Wildcard(n),
                Ok(Host::Name(_)) => {
                    return Err(bad(
                        "a wildcard needs at least two labels after `*.` (e.g. *.example.com)"
                            .into(),
                    ));
                }
                Ok(Host::Ip(_)) => return Err(bad("a wildcard cannot cover IP addresses".into())),
                Err(e) => return Err(bad(e.to_string())),
            }
        } else if raw.contains('*') {
            return Err(bad(
                "`*` is only allowed as the whole leftmost label (`*.example.com`)".into(),
            ));
        } else {
            // Bare IPv6 literals are accepted in rules for convenience.
            let parsed = match raw.parse::<std::net::Ipv6Addr>() {
                Ok(v6) => Ok(Host::Ip(canonical(IpAddr::V6(v6)))),
                Err(_) => parse_host(raw),
            };
            match parsed {
                Ok(Host::Name(n)) => Pattern::Exact(n),
                Ok(Host::Ip(ip)) => {
                    if let Some(class) = classify(ip)
                        && !allow_private.iter().any(|n| n.contains(&ip))
                    {
                        return Err(PolicyError::NonPublicIpRule {
                            index,
                            ip,
                            class: class.to_string(),
                        });
                    }
                    Pattern::Ip(ip)
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        };
        let mut ports = rule.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        rules.push(Rule { pattern, ports });
    }
    let compiled = CompiledPolicy {
        rules,
        allow_private,
    };
    for (index, c) in p.credentials.iter().enumerate() {
        check_credential(&compiled, c)
            .map_err(|reason| PolicyError::BadCredential { index, reason })?;
    }
    match &p.upstream_ca_file {
        None => {}
        Some(_) if p.credentials.is_empty() => {
            return Err(PolicyError::BadUpstreamCa(
                "only used for credentialed hosts, and there are no credentials".into(),
            ));
        }
        Some(f) if !f.starts_with('/') => {
            return Err(PolicyError::BadUpstreamCa(format!(
                "{f:?} is not an absolute path"
            )));
        }
        Some(_) => {}
    }
    Ok(compiled)
}

/// Headers a credential may not name: the ones that frame or route the request, and
/// hop-by-hop headers (which the gateway strips anyway).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-authorization",
    "proxy-authenticate",
];

/// The shape of one credential (its secret is read later, by the supervisor).
fn check_credential(
    compiled: &CompiledPolicy,
    c: &agentjail_manifest::Credential,
) -> Result<(), String> {
    if c.host.contains('*') {
        return Err(format!(
            "host {:?}: a credential needs an exact host name, not a wildcard",
            c.host
        ));
    }
    let name = match parse_host(&c.host) {
        Ok(Host::Name(n)) => n,
        Ok(Host::Ip(_)) => {
            return Err(format!(
                "host {:?}: a credential needs a host name, not an IP address",
                c.host
            ));
        }
        Err(e) => return Err(format!("host {:?} is invalid: {e}", c.host)),
    };
    if c.ports.is_empty() {
        return Err("ports is empty (the default is [443])".into());
    }
    for port in &c.ports {
        let admitted = compiled
            .match_target(&Target {
                host: Host::Name(name.clone()),
                port: *port,
            })
            .is_ok();
        if !admitted {
            return Err(format!(
                "host {name:?} port {port} is not admitted by any allow rule"
            ));
        }
    }
    if c.methods.is_empty() {
        return Err(format!(
            "methods is empty (the default is {:?})",
            agentjail_manifest::Credential::DEFAULT_METHODS
        ));
    }
    for m in &c.methods {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "method {m:?} must be an upper-case method name such as GET"
            ));
        }
        if NEVER_CREDENTIALED_METHODS.contains(&m.as_str()) {
            return Err(format!(
                "method {m:?} never carries a credential (TRACE and TRACK echo it, CONNECT opens a tunnel)"
            ));
        }
    }
    let header = c.header.to_ascii_lowercase();
    if header.is_empty()
        || !header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    {
        return Err(format!("header {:?} is not a valid header name", c.header));
    }
    if RESERVED_HEADERS.contains(&header.as_str()) {
        return Err(format!("header {:?} cannot carry a credential", c.header));
    }
    match c.value_from.split_once(':') {
        Some(("env", v)) if !v.is_empty() && !v.contains(['=', '\0']) => {}
        Some(("file", f)) if f.starts_with('/') && !f.contains('\0') => {}
        _ => {
            return Err(format!(
                "value_from must be `env:NAME` or `file:/absolute/path`, not {:?}",
                c.value_from
            ));
        }
    }
    if c.paths.is_empty() {
        return Err("paths is empty (use [\"/\"] for every path)".into());
    }
    if let Some(p) = c
        .paths
        .iter()
        .find(|p| !p.starts_with('/') || p.contains(['?', '#']))
    {
        return Err(format!(
            "path {p:?} must start with `/` and hold no `?` or `#`"
        ));
    }
    for p in &c.paths {
        if let Err(why) = crate::credential::unambiguous_path(p) {
            return Err(format!("path {p:?}: {why}"));
        }
    }
    Ok(())
}

/// Methods that never carry a credential: TRACE and TRACK echo the request's headers back,
/// and CONNECT opens a tunnel the gateway would not see into.
pub(crate) const NEVER_CREDENTIALED_METHODS: [&str; 3] = ["TRACE", "TRACK", "CONNECT"];

/// Why the allowlist does not allow a destination (the denial's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAllowed {
    /// The host is listed, not with this port.
    #[error("port {port} is not allowed for {host}")]
    Port { port: u16, host: Host },
    #[error("IP literal {0} is not in the allowlist")]
    IpLiteral(IpAddr),
    #[error("host {0} is not in the allowlist")]
    Host(String),
}

/// Why the gateway may not connect to an address (the denial's reason, after the host).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockedAddress {
    /// Not public unicast, and no `allow_private` CIDR contains it.
    #[error("address {ip} is {class}")]
    Class {
        ip: IpAddr,
        class: crate::addr::Classification,
    },
    /// One of the gateway host's own addresses.
    #[error("address {0} is an own address of the gateway host")]
    Own(IpAddr),
}

impl CompiledPolicy {
    /// Does any rule allow `target`? On success, returns the matching rule as text (for the
    /// decision's reason); on refusal, a one-line reason.
    pub fn match_target(&self, target: &Target) -> Result<String, NotAllowed> {
        let mut host_matched = false;
        for rule in &self.rules {
            let hit = match (&rule.pattern, &target.host) {
                (Pattern::Exact(r), Host::Name(n)) => r == n,
                (Pattern::Wildcard(s), Host::Name(n)) => n
                    .strip_suffix(s.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                (Pattern::Ip(r), Host::Ip(ip)) => r == ip,
                _ => false,
            };
            if hit {
                host_matched = true;
                if rule.ports.contains(&target.port) {
                    return Ok(rule.to_string());
                }
            }
        }
        Err(match (&target.host, host_matched) {
            (_, true) => NotAllowed::Port {
                port: target.port,
                host: target.host.clone(),
            },
            (Host::Ip(ip), false) => NotAllowed::IpLiteral(*ip),
            (Host::Name(n), false) => NotAllowed::Host(n.clone()),
        })
    }

    /// May the gateway connect to `ip`? Public unicast addresses may; any other address only
    /// if an `allow_private` CIDR contains it. On success returns a note when an exception was
    /// used; on refusal, a one-line reason.
    pub fn check_address(&self, ip: IpAddr) -> Result<Option<String>, BlockedAddress> {
        let ip = canonical(ip);
        match classify(ip) {
            None => Ok(None),
            Some(class) => match self.allow_private.iter().find(|n| n.contains(&ip)) {
                Some(net) => Ok(Some(format!(
                    "{class} address allowed by allow_private {net}"
                ))),
                None => Err(BlockedAddress::Class { ip, class }),
            },
        }
    }

    /// Like [`CompiledPolicy::check_address`], and an address in `own` (the gateway host's
    /// own addresses) counts as blocked like loopback, even when it is public: it would reach
    /// the host's own services. An `allow_private` CIDR can let it through, as for loopback.
    pub fn check_address_own(
        &self,
        ip: IpAddr,
        own: &[IpAddr],
    ) -> Result<Option<String>, BlockedAddress> {
        let ip = canonical(ip);
        if classify(ip).is_none() && own.contains(&ip) {
            return match self.allow_private.iter().find(|n| n.contains(&ip)) {
                Some(net) => Ok(Some(format!(
                    "own address of the gateway host allowed by allow_private {net}"
                ))),
                None => Err(BlockedAddress::Own(ip)),
            };
        }
        self.check_address(ip)
    }

    /// The `allow_private` CIDRs, normalised.
    pub fn allow_private(&self) -> &[IpNet] {
        &self.allow_private
    }

    /// The rules as text, e.g. `*.example.com:80,443`.
    pub fn rules(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.to_string()).collect()
    }
}

#[cfg(test)]
mod tests;
