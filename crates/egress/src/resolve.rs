//! Name resolution for the gateway: a small trait, a hickory-resolver implementation and a
//! static map for tests and special setups.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

/// A failed lookup. The message is safe to record (it names the host, nothing else).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The name does not exist or has no address records.
    #[error("{0} has no addresses")]
    NoAddresses(String),
    /// The lookup failed (timeout, server failure, ...).
    #[error("DNS lookup of {name} failed: {detail}")]
    Failed {
        /// The name looked up.
        name: String,
        /// What went wrong (from the resolver).
        detail: String,
    },
    /// The resolver could not be configured.
    #[error("DNS resolver configuration failed: {0}")]
    Config(String),
}

/// The future a [`Resolve`] implementation returns.
pub type ResolveFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, ResolveError>> + Send + 'a>>;

/// Resolves a normalised host name (lowercase ASCII, no trailing dot) to **all** its addresses.
///
/// The gateway vets every returned address and connects only to vetted ones, so an
/// implementation must return every address it knows, not a selection.
pub trait Resolve: Send + Sync {
    /// Looks `name` up. `name` is always an absolute name; implementations must not apply
    /// search domains.
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a>;
}

/// A resolver built on hickory-resolver.
///
/// Queries both A and AAAA records and treats the name as fully qualified (no search
/// domains, no `ndots` games).
#[derive(Clone)]
pub struct HickoryResolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for HickoryResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HickoryResolver").finish_non_exhaustive()
    }
}

impl HickoryResolver {
    /// Uses the host's configuration: `/etc/resolv.conf` for name servers and options, and
    /// `/etc/hosts`. Needs no running tokio runtime to construct.
    pub fn from_system_conf() -> Result<HickoryResolver, ResolveError> {
        let mut builder =
            TokioResolver::builder_tokio().map_err(|e| ResolveError::Config(e.to_string()))?;
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.use_hosts_file = ResolveHosts::Always;
        let inner = builder
            .build()
            .map_err(|e| ResolveError::Config(e.to_string()))?;
        Ok(HickoryResolver { inner })
    }

    /// Uses only the given name servers (plain UDP, falling back to TCP for truncated
    /// answers), no hosts file and no cache. Meant for tests and for operators who run their
    /// own resolver.
    pub fn with_name_servers(
        servers: &[SocketAddr],
        timeout: Duration,
    ) -> Result<HickoryResolver, ResolveError> {
        if servers.is_empty() {
            return Err(ResolveError::Config("no name servers given".into()));
        }
        let name_servers = servers
            .iter()
            .map(|s| {
                let mut udp = ConnectionConfig::udp();
                udp.port = s.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = s.port();
                let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                ns.connections = vec![udp, tcp];
                ns
            })
            .collect();
        let config = ResolverConfig::from_parts(None, vec![], name_servers);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.cache_size = 0;
        opts.timeout = timeout;
        opts.attempts = 1;
        opts.ndots = 0;
        let inner = builder
            .build()
            .map_err(|e| ResolveError::Config(e.to_string()))?;
        Ok(HickoryResolver { inner })
    }
}

impl Resolve for HickoryResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        Box::pin(async move {
            // Absolute name: never let search domains turn `api.example.com` into
            // `api.example.com.corp.internal`.
            let fqdn = format!("{name}.");
            match self.inner.lookup_ip(fqdn.as_str()).await {
                Ok(lookup) => {
                    let addrs: Vec<IpAddr> = lookup.iter().collect();
                    if addrs.is_empty() {
                        Err(ResolveError::NoAddresses(name.to_owned()))
                    } else {
                        Ok(addrs)
                    }
                }
                Err(e) if e.is_no_records_found() || e.is_nx_domain() => {
                    Err(ResolveError::NoAddresses(name.to_owned()))
                }
                Err(e) => Err(ResolveError::Failed {
                    name: name.to_owned(),
                    detail: e.to_string(),
                }),
            }
        })
    }
}

/// A fixed map from names to addresses. Names are matched after the same normalisation the
/// gateway applies (so insert `"bücher.example"` or `"xn--bcher-kva.example"`, either works).
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    map: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty map: every lookup fails with [`ResolveError::NoAddresses`].
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Adds `name → addrs` (replacing an earlier entry). Invalid names are ignored.
    pub fn insert(mut self, name: &str, addrs: &[IpAddr]) -> StaticResolver {
        if let Ok(crate::host::Host::Name(n)) = crate::host::parse_host(name) {
            self.map.insert(n, addrs.to_vec());
        }
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        Box::pin(async move {
            match self.map.get(name) {
                Some(a) if !a.is_empty() => Ok(a.clone()),
                _ => Err(ResolveError::NoAddresses(name.to_owned())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_resolver_normalises_names() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let r = StaticResolver::new()
            .insert("BÜCHER.example.", &[lo])
            .insert("not a name", &[lo]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(
            rt.block_on(r.resolve("xn--bcher-kva.example")),
            Ok(vec![lo])
        );
        assert!(matches!(
            rt.block_on(r.resolve("other.example")),
            Err(ResolveError::NoAddresses(_))
        ));
    }

    #[test]
    fn resolvers_construct_without_network() {
        // Building reads configuration only; no query is sent.
        assert!(HickoryResolver::with_name_servers(&[], Duration::from_secs(1)).is_err());
        let ns: SocketAddr = "127.0.0.1:53".parse().unwrap();
        assert!(HickoryResolver::with_name_servers(&[ns], Duration::from_secs(1)).is_ok());
        match HickoryResolver::from_system_conf() {
            Ok(_) | Err(ResolveError::Config(_)) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}
