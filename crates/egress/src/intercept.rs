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
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use agentjail_manifest::EgressPolicy;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::credential::{BodyMasker, Needles, SmuggleScanner};
use crate::host::{Host, Target, parse_host};
use crate::meter::BoxError;

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
    pub(crate) methods: Vec<String>,
    pub(crate) ports: Vec<u16>,
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
    /// The copies of its secrets that must not come back to the sandbox.
    pub(crate) needles: Needles,
}

/// Why a request to a credentialed host goes without a given credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Without {
    /// Its path is under none of the credential's `paths`.
    Path,
    /// Its method is not among the credential's `methods`.
    Method,
}

impl HostTls {
    /// The secrets a request with `method` and `path`, sent to this host on `port`, gets; and
    /// when it gets none although the host has some for this port, why.
    pub(crate) fn applicable(
        &self,
        method: &str,
        port: u16,
        path: &str,
    ) -> (Vec<&Secret>, Option<Without>) {
        let mut why = None;
        let mut got = Vec::new();
        for s in self.secrets.iter().filter(|s| s.ports.contains(&port)) {
            if !s.paths.iter().any(|p| covers(p, path)) {
                why.get_or_insert(Without::Path);
            } else if !s.methods.iter().any(|m| m == method) {
                why = Some(Without::Method);
            } else {
                got.push(s);
            }
        }
        let why = if got.is_empty() { why } else { None };
        (got, why)
    }
}

/// Whether the `paths` entry `prefix` covers `path`: a prefix ending in `/` covers what starts
/// with it; another covers itself and what lies below it as a path segment (`/v1` covers
/// `/v1` and `/v1/x`, not `/v1-internal`).
pub(crate) fn covers(prefix: &str, path: &str) -> bool {
    if prefix.ends_with('/') {
        return path.starts_with(prefix);
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
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
pub fn read_secret(value_from: &str) -> Result<String, String> {
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
                methods: c.methods.clone(),
                ports: c.ports.clone(),
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
            let needles = Needles::new(secrets.iter().map(|s| s.value.as_bytes()));
            hosts.insert(
                name.clone(),
                Arc::new(HostTls {
                    name,
                    server: Arc::new(server),
                    secrets,
                    needles,
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

    /// The host's TLS and secrets when some credential of `t`'s host covers `t`'s port: a
    /// connection to any other port is a plain tunnel and never carries one.
    pub(crate) fn for_target(&self, t: &Target) -> Option<Arc<HostTls>> {
        match &t.host {
            Host::Name(n) => self
                .hosts
                .get(n)
                .filter(|h| h.secrets.iter().any(|s| s.ports.contains(&t.port)))
                .cloned(),
            Host::Ip(_) => None,
        }
    }
}

/// Removes every header named like one of the host's secrets from a request the sandbox
/// sent, then adds each secret that `applicable` chose. Returns the labels of those added.
pub(crate) fn apply(host: &HostTls, add: &[&Secret], headers: &mut HeaderMap) -> Vec<String> {
    for s in &host.secrets {
        headers.remove(&s.header);
    }
    let mut added = Vec::new();
    for s in add {
        headers.append(s.header.clone(), s.value.clone());
        added.push(s.label(&host.name));
    }
    added
}

/// Removes every response header whose name or value holds one of the host's secrets or its
/// bare token (any case, or a piece of at least [`Needles::PIECE`] bytes of it), and every
/// header that holds part of a copy split across several values. Returns how many were
/// removed.
pub(crate) fn redact_response(host: &HostTls, headers: &mut HeaderMap) -> usize {
    let all: Vec<(HeaderName, HeaderValue)> = headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let values: Vec<&[u8]> = all.iter().map(|(_, v)| v.as_bytes()).collect();
    let split = host.needles.header_spans(&values);
    let mut keep = HeaderMap::with_capacity(all.len());
    let mut removed = 0;
    for (i, (k, v)) in all.into_iter().enumerate() {
        if split.contains(&i)
            || host.needles.in_header(k.as_str().as_bytes())
            || host.needles.in_header(v.as_bytes())
        {
            removed += 1;
        } else {
            keep.append(k, v);
        }
    }
    *headers = keep;
    removed
}

/// The size of a body that passes on all of `inner` and the `held` bytes a wrapper holds
/// back (neither wrapper below changes a body's length).
fn plus_held(inner: SizeHint, held: usize) -> SizeHint {
    let held = held as u64;
    let mut h = SizeHint::new();
    h.set_lower(inner.lower().saturating_add(held));
    if let Some(u) = inner.upper() {
        h.set_upper(u.saturating_add(held));
    }
    h
}

/// A response body from a credentialed host with every copy of its secrets masked at the
/// same length ([`BodyMasker`]), trailers dropped. The copies masked are added to `masked`.
pub(crate) struct MaskedBody<B> {
    pub(crate) inner: B,
    masker: BodyMasker,
    done: bool,
    masked: Arc<AtomicU64>,
}

impl<B> MaskedBody<B> {
    pub(crate) fn new(inner: B, host: &HostTls, masked: Arc<AtomicU64>) -> MaskedBody<B> {
        MaskedBody {
            inner,
            masker: BodyMasker::new(host.needles.clone()),
            done: false,
            masked,
        }
    }
}

impl<B> Body for MaskedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers from a credentialed host are not passed on (they could echo).
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let out = self.masker.push(&data);
                    self.masked.store(self.masker.masked(), Ordering::SeqCst);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    self.done = true;
                    let tail = self.masker.finish();
                    self.masked.store(self.masker.masked(), Ordering::SeqCst);
                    if tail.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(tail)))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Held-back bytes may still be due after the inner body ended.
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        plus_held(self.inner.size_hint(), self.masker.held())
    }
}

/// A request body to a credentialed host, passed on line by line through a
/// [`SmuggleScanner`]: a line that is an HTTP request line ends the body with an error (and
/// sets `smuggled`) before any of its bytes left.
pub(crate) struct SmuggleGuard<B> {
    inner: B,
    scanner: SmuggleScanner,
    done: bool,
    smuggled: Arc<AtomicBool>,
}

impl<B> SmuggleGuard<B> {
    pub(crate) fn new(inner: B, smuggled: Arc<AtomicBool>) -> SmuggleGuard<B> {
        SmuggleGuard {
            inner,
            scanner: SmuggleScanner::default(),
            done: false,
            smuggled,
        }
    }

    fn refuse(&mut self, why: &'static str) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.smuggled.store(true, Ordering::SeqCst);
        Poll::Ready(Some(Err(why.into())))
    }
}

impl<B> Body for SmuggleGuard<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers of a request to a credentialed host are not forwarded.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    match self.scanner.push(&data) {
                        Ok(out) if out.is_empty() => {}
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
                        Err(why) => return self.refuse(why),
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    self.done = true;
                    return match self.scanner.finish() {
                        Ok(tail) if tail.is_empty() => Poll::Ready(None),
                        Ok(tail) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(tail))))),
                        Err(why) => self.refuse(why),
                    };
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.inner.is_end_stream() && self.scanner.held() == 0)
    }

    fn size_hint(&self) -> SizeHint {
        plus_held(self.inner.size_hint(), self.scanner.held())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            needles: Needles::new([v.as_bytes()]),
            secrets: vec![Secret {
                header: HeaderName::from_static("authorization"),
                value: v,
                paths: vec!["/v1/".into()],
                methods: vec!["GET".into(), "POST".into()],
                ports: vec![443],
            }],
        }
    }

    #[test]
    fn apply_strips_and_adds_only_on_paths_methods_and_ports() {
        let h = host("Bearer s3cret");
        let mut m = HeaderMap::new();
        m.append("authorization", HeaderValue::from_static("Bearer mine"));
        m.append("Authorization", HeaderValue::from_static("Bearer mine2"));
        let (add, why) = h.applicable("GET", 443, "/v1/x");
        assert_eq!(why, None);
        assert_eq!(
            apply(&h, &add, &mut m),
            vec!["authorization for api.test".to_string()]
        );
        assert_eq!(m.get_all("authorization").iter().count(), 1);
        assert_eq!(m.get("authorization").unwrap(), "Bearer s3cret");
        for (method, port, path, want) in [
            ("GET", 443, "/v2/x", Some(Without::Path)),
            ("PROPFIND", 443, "/v1/x", Some(Without::Method)),
            ("get", 443, "/v1/x", Some(Without::Method)),
            ("GET", 8443, "/v1/x", None),
        ] {
            let mut m = HeaderMap::new();
            m.append("authorization", HeaderValue::from_static("Bearer mine"));
            let (add, why) = h.applicable(method, port, path);
            assert_eq!(why, want, "{method} {port} {path}");
            assert!(apply(&h, &add, &mut m).is_empty());
            assert!(m.get("authorization").is_none());
        }
    }

    #[test]
    fn a_path_prefix_covers_whole_segments() {
        assert!(covers("/v1/", "/v1/x"));
        assert!(!covers("/v1/", "/v1"));
        assert!(covers("/v1", "/v1"));
        assert!(covers("/v1", "/v1/x"));
        assert!(!covers("/v1", "/v1-internal/admin"));
        assert!(!covers("/v1", "/v10"));
        assert!(covers("/", "/anything"));
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
        m.append("x-lower", HeaderValue::from_static("bearer S3CRET"));
        m.append("x-bare", HeaderValue::from_static("s3cret"));
        m.append("x-s3cret", HeaderValue::from_static("1"));
        m.append("x-part1", HeaderValue::from_static("Bear"));
        m.append("x-part2", HeaderValue::from_static("er s3"));
        m.append("x-part3", HeaderValue::from_static("cret"));
        // x-part1 ("Bear") holds none of the token, which x-part2 and x-part3 hold between them.
        assert_eq!(redact_response(&h, &mut m), 6);
        assert!(m.get("x-echo").is_none());
        assert_eq!(m.len(), 2);
        assert!(m.get("x-fine").is_some());
        assert!(m.get("x-part1").is_some());
    }
}
