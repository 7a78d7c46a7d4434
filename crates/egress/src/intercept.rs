//! Credentials bound to a destination: the per-run CA, the TLS configurations on both sides of
//! the gateway, and the secrets themselves.
//!
//! For a host named in `network.credentials` the gateway terminates the sandbox's TLS (the
//! sandbox trusts a CA generated for this run), speaks HTTP to it, and opens its own TLS
//! connection to the vetted upstream address, verified against the host's trust store or
//! `network.upstream_ca_file`. The CA's private key signs one leaf certificate per credentialed
//! host when the run starts and is then dropped: it never exists outside this process's memory,
//! and not even there once [`Interception::prepare`] returns. The CA certificate is
//! name-constrained to the credentialed hosts, so even a leaked leaf key or CA could vouch for
//! nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentjail_manifest::EgressPolicy;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::host::{Host, Target, parse_host};

/// Why the credential flow could not be prepared. One line; never a secret value.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The secret could not be read from where `value_from` says.
    #[error("network.credentials[{index}] ({host} {header}): {reason}")]
    Secret {
        /// Index of the entry.
        index: usize,
        /// Its host.
        host: String,
        /// Its header name.
        header: String,
        /// Why (never the value).
        reason: String,
    },
    /// A certificate or TLS configuration could not be built.
    #[error("network.credentials: {0}")]
    Tls(String),
    /// The upstream trust store could not be loaded.
    #[error("network.upstream_ca_file: {0}")]
    UpstreamCa(String),
}

/// One secret, ready to be added.
pub(crate) struct Secret {
    pub(crate) header: HeaderName,
    pub(crate) value: HeaderValue,
    pub(crate) paths: Vec<String>,
}

impl Secret {
    /// `header for host`: how reports and logs name it.
    pub(crate) fn label(&self, host: &str) -> String {
        format!("{} for {host}", self.header)
    }
}

/// Everything the gateway needs for one credentialed host.
pub(crate) struct HostTls {
    pub(crate) name: String,
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) secrets: Vec<Secret>,
}

/// The credential flow of one run: per-host leaf certificates and secrets, the upstream TLS
/// configuration, and the CA certificate (public) the sandbox must trust.
pub struct Interception {
    ca_pem: String,
    hosts: BTreeMap<String, Arc<HostTls>>,
    pub(crate) upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("Interception")
            .field("hosts", &self.hosts.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> CredentialError {
    CredentialError::Tls(format!("{what}: {e}"))
}

/// Reads one secret from the supervisor's environment or a file.
fn read_secret(value_from: &str) -> Result<String, String> {
    match value_from.split_once(':') {
        Some(("env", name)) => std::env::var(name).map_err(|e| match e {
            std::env::VarError::NotPresent => {
                format!("environment variable {name} is not set for the supervisor")
            }
            std::env::VarError::NotUnicode(_) => {
                format!("environment variable {name} is not valid UTF-8")
            }
        }),
        Some(("file", path)) => match std::fs::read_to_string(path) {
            Ok(mut s) => {
                if s.ends_with('\n') {
                    s.pop();
                    if s.ends_with('\r') {
                        s.pop();
                    }
                }
                Ok(s)
            }
            Err(e) => Err(format!("cannot read {path}: {}", e.kind())),
        },
        _ => Err("value_from must be `env:NAME` or `file:/absolute/path`".into()),
    }
}

impl Interception {
    /// Reads every secret of `policy.credentials`, generates the per-run CA and one leaf
    /// certificate per credentialed host, and loads the upstream trust store. `Ok(None)` when
    /// the policy has no credentials. The policy must have passed
    /// [`compile_policy`](crate::compile_policy).
    pub fn prepare(policy: &EgressPolicy) -> Result<Option<Interception>, CredentialError> {
        if policy.credentials.is_empty() {
            return Ok(None);
        }
        let mut by_host: BTreeMap<String, Vec<Secret>> = BTreeMap::new();
        for (index, c) in policy.credentials.iter().enumerate() {
            let err = |reason: String| CredentialError::Secret {
                index,
                host: c.host.clone(),
                header: c.header.clone(),
                reason,
            };
            let name = match parse_host(&c.host) {
                Ok(Host::Name(n)) => n,
                _ => return Err(err("host is not a host name".into())),
            };
            let header = HeaderName::from_bytes(c.header.as_bytes())
                .map_err(|_| err("invalid header name".into()))?;
            let value = read_secret(&c.value_from).map_err(err)?;
            if value.is_empty() {
                return Err(err("the secret is empty".into()));
            }
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                err(
                    "the secret is not a valid header value (control characters or non-ASCII)"
                        .into(),
                )
            })?;
            value.set_sensitive(true);
            by_host.entry(name).or_default().push(Secret {
                header,
                value,
                paths: c.paths.clone(),
            });
        }

        // The per-run CA: constrained to the credentialed names, and used once.
        let ca_key = rcgen::KeyPair::generate().map_err(|e| tls_err("CA key", e))?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())
            .map_err(|e| tls_err("CA parameters", e))?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca_params.distinguished_name = rcgen::DistinguishedName::new();
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agentjail per-run credential CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        ca_params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: by_host
                .keys()
                .map(|h| rcgen::GeneralSubtree::DnsName(h.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(|e| tls_err("CA certificate", e))?;
        let ca_pem = ca_cert.pem();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let mut hosts = BTreeMap::new();
        for (name, secrets) in by_host {
            let leaf_key = rcgen::KeyPair::generate().map_err(|e| tls_err("leaf key", e))?;
            let mut params = rcgen::CertificateParams::new(vec![name.clone()])
                .map_err(|e| tls_err("leaf parameters", e))?;
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name.clone());
            params.is_ca = rcgen::IsCa::ExplicitNoCa;
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
            params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
            let leaf = params
                .signed_by(&leaf_key, &issuer)
                .map_err(|e| tls_err("leaf certificate", e))?;
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
            let mut server = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| tls_err("server TLS versions", e))?
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone()], key)
                .map_err(|e| tls_err("server certificate", e))?;
            server.alpn_protocols = vec![b"http/1.1".to_vec()];
            hosts.insert(
                name.clone(),
                Arc::new(HostTls {
                    name,
                    server: Arc::new(server),
                    secrets,
                }),
            );
        }
        // The CA key goes out of scope here: nothing can sign for this run any more.
        drop(issuer);

        let mut roots = rustls::RootCertStore::empty();
        match &policy.upstream_ca_file {
            Some(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .map_err(|e| CredentialError::UpstreamCa(format!("{path}: {e}")))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| CredentialError::UpstreamCa(format!("{path}: {e}")))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(CredentialError::UpstreamCa(format!(
                        "{path} holds no usable CA certificate"
                    )));
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err(CredentialError::UpstreamCa(
                        "the host's trust store holds no usable CA certificate; set network.upstream_ca_file".into(),
                    ));
                }
            }
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("client TLS versions", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Interception {
            ca_pem,
            hosts,
            upstream: Arc::new(upstream),
        }))
    }

    /// The per-run CA certificate (PEM, public): what the sandbox must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The credentialed hosts, normalised.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str)
    }

    pub(crate) fn for_target(&self, t: &Target) -> Option<Arc<HostTls>> {
        match &t.host {
            Host::Name(n) => self.hosts.get(n).cloned(),
            Host::Ip(_) => None,
        }
    }
}

/// A path with a dot segment (`.` or `..`, literal or percent-encoded) or a backslash: servers
/// disagree on how to normalise it, so a prefix match on it means nothing.
pub(crate) fn ambiguous_path(path: &str) -> bool {
    if path.contains('\\') {
        return true;
    }
    path.split('/').any(|seg| {
        let s = seg.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    }) || path.to_ascii_lowercase().contains("%5c")
}

/// Removes every header named like one of `secrets` from a request the sandbox sent, then
/// adds each secret whose paths cover `path`. Returns the labels of the secrets added.
pub(crate) fn apply(host: &HostTls, path: &str, headers: &mut HeaderMap) -> Vec<String> {
    for s in &host.secrets {
        headers.remove(&s.header);
    }
    let mut added = Vec::new();
    for s in &host.secrets {
        if s.paths.iter().any(|p| path.starts_with(p.as_str())) {
            headers.append(s.header.clone(), s.value.clone());
            added.push(s.label(&host.name));
        }
    }
    added
}

/// Removes every response header whose value contains one of the host's secrets. Returns how
/// many were removed.
pub(crate) fn redact_response(host: &HostTls, headers: &mut HeaderMap) -> usize {
    let bad: Vec<HeaderName> = headers
        .iter()
        .filter(|(_, v)| {
            host.secrets.iter().any(|s| {
                let needle = s.value.as_bytes();
                v.as_bytes().windows(needle.len()).any(|w| w == needle)
            })
        })
        .map(|(k, _)| k.clone())
        .collect();
    let n = bad.len();
    for k in bad {
        headers.remove(k);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ambiguous_paths() {
        for p in [
            "/v1/../admin",
            "/v1/%2e%2e/admin",
            "/v1/%2E./x",
            "/./v1",
            "/v1\\x",
            "/v1/.",
            "/v1%5c..",
            "/v1/.%2e",
        ] {
            assert!(ambiguous_path(p), "{p}");
        }
        for p in ["/v1/x", "/v1/..x", "/v1/.well-known", "/", "/v1/a%2fb"] {
            assert!(!ambiguous_path(p), "{p}");
        }
    }

    fn host(value: &str) -> HostTls {
        let mut v = HeaderValue::from_str(value).unwrap();
        v.set_sensitive(true);
        let _ = rustls::crypto::ring::default_provider();
        HostTls {
            name: "api.test".into(),
            server: Arc::new(
                rustls::ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_cert_resolver(
                        Arc::new(rustls::server::ResolvesServerCertUsingSni::new()),
                    ),
            ),
            secrets: vec![Secret {
                header: HeaderName::from_static("authorization"),
                value: v,
                paths: vec!["/v1/".into()],
            }],
        }
    }

    #[test]
    fn apply_strips_and_adds_only_on_paths() {
        let h = host("Bearer s3cret");
        let mut m = HeaderMap::new();
        m.append("authorization", HeaderValue::from_static("Bearer mine"));
        m.append("Authorization", HeaderValue::from_static("Bearer mine2"));
        assert_eq!(
            apply(&h, "/v1/x", &mut m),
            vec!["authorization for api.test".to_string()]
        );
        assert_eq!(m.get_all("authorization").iter().count(), 1);
        assert_eq!(m.get("authorization").unwrap(), "Bearer s3cret");
        let mut m = HeaderMap::new();
        m.append("authorization", HeaderValue::from_static("Bearer mine"));
        assert!(apply(&h, "/v2/x", &mut m).is_empty());
        assert!(m.get("authorization").is_none());
    }

    #[test]
    fn redact_removes_echoes() {
        let h = host("Bearer s3cret");
        let mut m = HeaderMap::new();
        m.append(
            "x-echo",
            HeaderValue::from_static("you sent Bearer s3cret!"),
        );
        m.append("x-fine", HeaderValue::from_static("ok"));
        assert_eq!(redact_response(&h, &mut m), 1);
        assert!(m.get("x-echo").is_none());
        assert!(m.get("x-fine").is_some());
    }
}
