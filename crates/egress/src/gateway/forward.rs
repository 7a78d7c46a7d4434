//! Forwarding one HTTP request to its destination, plain `http://` or inside a TLS connection
//! the gateway terminated for a credentialed host: the destination vetted for every request,
//! pooled upstream connections reused only for the same host, port and address, hop-by-hop
//! headers dropped, credentials added where the rules say, and every `Location` of the
//! response checked like a destination before the client may follow it.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;

use crate::credential::{SMUGGLED, unambiguous_path};
use crate::decision::{Decision, ms, sanitize};
use crate::host::{Target, parse_authority, redirect_target};
use crate::intercept::{HostTls, MaskedBody, SmuggleGuard, Without};
use crate::meter::{BoxError, Dir, Flow, Meter, MeteredBody};
use crate::policy::NEVER_CREDENTIALED_METHODS;

use super::shared::{
    AbortOnDrop, ConnCtx, Pending, Pooled, RespBody, Sender, Shared, lock, refusal,
};
use super::vet::{recorded_host, target_refusal_status};

/// Hop-by-hop headers (RFC 9110 section 7.6.1) and proxy credentials, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(super) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        h.remove(name);
    }
    for name in HOP_BY_HOP {
        h.remove(*name);
    }
}

fn head_bytes(h: &HeaderMap) -> u64 {
    h.iter()
        .map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64)
        .sum()
}

/// Starts an HTTP/1.1 client connection on `io`, driven by a task of its own.
async fn client_handshake<T>(
    max_header_bytes: usize,
    io: T,
) -> Result<(Sender, AbortOnDrop), hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut client = hyper::client::conn::http1::Builder::new();
    client.max_header_size(max_header_bytes.max(1024));
    let (sender, conn) = client.handshake(TokioIo::new(io)).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, AbortOnDrop(driver)))
}

pub(super) async fn handle_forward(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    req: Request<hyper::body::Incoming>,
    mut d: Decision,
    start: Instant,
    tls: Option<Arc<HostTls>>,
) -> Response<RespBody> {
    let uri = req.uri().clone();
    let (scheme, default_port) = if tls.is_some() {
        ("https", 443)
    } else {
        ("http", 80)
    };
    let Some(authority) = uri.authority().map(|a| a.as_str().to_owned()) else {
        let reason = "not a proxy request";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    };
    let target = match parse_authority(&authority, Some(default_port)) {
        Ok(t) => t,
        Err(e) => {
            d.host = recorded_host(&authority, &e);
            let reason = format!("refused destination: {e}");
            shared.deny(d, start, &reason, None);
            return refusal(target_refusal_status(&e), &reason);
        }
    };
    d.host = target.host.to_string();
    d.port = target.port;
    if !uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    {
        let reason = "only http:// URLs are forwarded; use CONNECT for TLS";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    }
    // The Host header, if present, must name the same destination as the URL.
    let hosts: Vec<&HeaderValue> = req.headers().get_all(header::HOST).iter().collect();
    let host_ok = match hosts.as_slice() {
        [] => true,
        [one] => one
            .to_str()
            .ok()
            .and_then(|s| parse_authority(s, Some(default_port)).ok())
            .is_some_and(|h| h == target),
        _ => false,
    };
    if !host_ok {
        let reason = "Host header does not match the request URL";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    }
    // A credentialed host: a path servers could normalise differently is refused (a prefix
    // match on `/v1/../admin` means nothing), a body where the upstream may not read one is
    // refused (it could be taken for the next request on the connection), and the decision
    // names the credentials added.
    let has_body = !hyper::body::Body::is_end_stream(req.body());
    // The method as sent (the decision's `method` field folds unknown ones into OTHER; the
    // credential rules must not).
    let method = req.method().as_str().to_owned();
    let shown = sanitize(&method, 32);
    let mut add: Vec<&crate::intercept::Secret> = Vec::new();
    let mut without = None;
    if let Some(tls) = &tls {
        let path = uri.path();
        if has_body && BODILESS_METHODS.contains(&method.as_str()) {
            let reason = format!(
                "a request body on {shown} is refused for a credentialed host (rule: no body where the upstream may not read one)"
            );
            shared.deny(d, start, &reason, None);
            return refusal(StatusCode::BAD_REQUEST, &reason);
        }
        if !NEVER_CREDENTIALED_METHODS.contains(&method.as_str()) {
            (add, without) = tls.applicable(&method, target.port, path);
        }
        // Only a request that would carry the secret needs a path every server reads alike:
        // one without it carries nothing to misdirect.
        if !add.is_empty()
            && let Err(rule) = unambiguous_path(path)
        {
            let reason = format!(
                "path refused for a credentialed request (rule: unambiguous paths): {rule}"
            );
            shared.deny(d, start, &reason, None);
            return refusal(StatusCode::BAD_REQUEST, &reason);
        }
    }
    let added: Vec<String> = match &tls {
        Some(tls) => add.iter().map(|s| s.label(&tls.name)).collect(),
        None => Vec::new(),
    };
    // Text an upstream chose (a Location, a coding, an error) goes into refusals and the
    // report only with any copy of a credential masked.
    let redact = |text: &str| match &tls {
        Some(tls) => tls.needles.redact(text),
        None => text.to_owned(),
    };
    // Vetted for every request, pooled connection or not: a pooled connection is used only
    // for the same host and port and when its address is among the addresses vetted now.
    let vetted = match shared.vet(&target).await {
        Ok(v) => v,
        Err(r) => {
            shared.deny(d, start, &r.reason, r.address);
            return refusal(r.status, &r.reason);
        }
    };
    if let Some(what) = shared.budget.exhausted() {
        let reason = format!("{what} budget already used up");
        shared.deny(d, start, &reason, None);
        return refusal(StatusCode::FORBIDDEN, &reason);
    }
    // A request that gets a credential travels only on a connection of its own: never on
    // one that carried an earlier request.
    let reused = if added.is_empty() {
        ctx.checkout(&target, &vetted.addrs).await
    } else {
        None
    };
    let fresh = match reused {
        Some(_) => None,
        None => match shared.connect(&vetted.addrs, target.port).await {
            Ok(x) => Some(x),
            Err(r) => {
                shared.deny(d, start, &r.reason, r.address);
                return refusal(r.status, &r.reason);
            }
        },
    };
    let addr = match (&reused, &fresh) {
        (Some(p), _) => p.addr,
        (None, Some((_, a))) => *a,
        (None, None) => return refusal(StatusCode::BAD_GATEWAY, "no upstream connection"),
    };
    d.allowed = true;
    d.address = Some(addr);
    d.reason = match (&tls, added.is_empty()) {
        (None, _) => vetted.reason,
        (Some(_), true) => match without {
            Some(Without::Method) => {
                format!("{}; no credential for method {shown}", vetted.reason)
            }
            Some(Without::Path) | None if NEVER_CREDENTIALED_METHODS.contains(&method.as_str()) => {
                format!("{}; no credential for method {shown}", vetted.reason)
            }
            Some(Without::Path) | None => {
                format!("{}; no credential for this path", vetted.reason)
            }
        },
        (Some(_), false) => format!("{}; credential {} added", vetted.reason, added.join(", ")),
    };
    let flow = Arc::new(Flow::default());
    let meter = Meter {
        budget: shared.budget.clone(),
        flow: flow.clone(),
    };
    let pending = Arc::new(Pending::new(shared.clone(), ctx, flow, d.clone(), start));

    let mut up = match (reused, fresh) {
        (Some(p), _) => p,
        (None, Some((upstream, addr))) => {
            let max = shared.limits.max_header_bytes;
            let handshake = match (&tls, &shared.intercept) {
                (None, _) => client_handshake(max, upstream).await,
                (Some(tls), Some(i)) => {
                    let connector = tokio_rustls::TlsConnector::from(i.upstream.clone());
                    let name = match rustls::pki_types::ServerName::try_from(tls.name.clone()) {
                        Ok(n) => n,
                        Err(_) => {
                            let reason = format!("{} is not a valid TLS server name", tls.name);
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::BAD_GATEWAY, &reason);
                        }
                    };
                    let connected = tokio::time::timeout(
                        shared.limits.connect_timeout,
                        connector.connect(name, upstream),
                    )
                    .await;
                    match connected {
                        Ok(Ok(s)) => client_handshake(max, s).await,
                        Ok(Err(e)) => {
                            let reason = tls.needles.redact(&format!(
                                "upstream TLS with {} failed: {}",
                                tls.name,
                                sanitize(&e.to_string(), 200)
                            ));
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::BAD_GATEWAY, &reason);
                        }
                        Err(_) => {
                            let reason = format!("upstream TLS with {} timed out", tls.name);
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::GATEWAY_TIMEOUT, &reason);
                        }
                    }
                }
                (Some(_), None) => {
                    let reason = "internal: a credentialed request without the credential flow";
                    pending.refuse(reason.into());
                    return refusal(StatusCode::BAD_GATEWAY, reason);
                }
            };
            let (sender, driver) = match handshake {
                Ok(x) => x,
                Err(e) => {
                    let reason = format!("upstream handshake failed: {e}");
                    pending.refuse(reason.clone());
                    return refusal(StatusCode::BAD_GATEWAY, &reason);
                }
            };
            Pooled {
                host: target.host.clone(),
                port: target.port,
                addr,
                sender,
                _driver: driver,
            }
        }
        (None, None) => return refusal(StatusCode::BAD_GATEWAY, "no upstream connection"),
    };

    let (mut parts, body) = req.into_parts();
    let origin_form = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|s| s.starts_with('/'))
        .unwrap_or("/")
        .to_owned();
    let Ok(path) = origin_form.parse::<Uri>() else {
        let reason = "request path could not be forwarded";
        pending.refuse(reason.into());
        return refusal(StatusCode::BAD_REQUEST, reason);
    };
    strip_hop_by_hop(&mut parts.headers);
    if let Some(tls) = &tls {
        // The sandbox cannot choose a credential's value: its own header of that name goes.
        crate::intercept::apply(tls, &add, &mut parts.headers);
        // An encoded body could not be scanned for an echoed secret.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    match HeaderValue::from_str(&authority) {
        Ok(v) => {
            parts.headers.insert(header::HOST, v);
        }
        Err(_) => {
            let reason = "request authority could not be forwarded";
            pending.refuse(reason.into());
            return refusal(StatusCode::BAD_REQUEST, reason);
        }
    }
    let head =
        (parts.method.as_str().len() + origin_form.len() + 12) as u64 + head_bytes(&parts.headers);
    if !meter.take(Dir::Up, head) {
        return refusal(StatusCode::FORBIDDEN, "max_bytes_up exceeded");
    }
    // A body to a credentialed host must not hold a request of its own (smuggled to an
    // upstream, or to the server behind a front proxy, that leaves it unread).
    let smuggled = Arc::new(AtomicBool::new(false));
    let body = match &tls {
        Some(_) => SmuggleGuard::new(body, smuggled.clone()).boxed(),
        None => body.map_err(BoxError::from).boxed(),
    };
    let body = MeteredBody {
        inner: body,
        meter: meter.clone(),
        dir: Dir::Up,
        _keep: (),
    };
    let mut out = Request::new(body.boxed());
    *out.method_mut() = parts.method.clone();
    *out.uri_mut() = path;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = parts.headers;

    let resp = match up.sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => {
            let (status, reason) = if smuggled.load(Ordering::SeqCst) {
                (StatusCode::BAD_REQUEST, SMUGGLED.to_owned())
            } else if meter.flow.exceeded().is_some() {
                (
                    StatusCode::BAD_GATEWAY,
                    "request body exceeded the byte budget".to_owned(),
                )
            } else {
                (
                    StatusCode::BAD_GATEWAY,
                    redact(&format!("upstream request failed: {e}")),
                )
            };
            pending.refuse(reason.clone());
            return refusal(status, &reason);
        }
    };

    // A response that frames its body twice is a smuggling attempt toward the client.
    if resp.headers().contains_key(header::CONTENT_LENGTH)
        && resp.headers().contains_key(header::TRANSFER_ENCODING)
    {
        let reason =
            format!("response from {target} has both Content-Length and Transfer-Encoding");
        pending.refuse(reason.clone());
        drop(resp);
        return refusal(StatusCode::BAD_GATEWAY, &reason);
    }

    // Location and Content-Location, on every status: the target must pass the same checks
    // before the client may follow it.
    if let Some((host, port, why, address)) =
        check_locations(&shared, &target, resp.headers()).await
    {
        let reason = redact(&format!("redirect from {target} refused: {why}"));
        let denial = Decision {
            allowed: false,
            method: d.method.clone(),
            host: redact(&host),
            port,
            address,
            reason: reason.clone(),
            bytes_up: 0,
            bytes_down: 0,
            started_ms: d.started_ms,
            duration_ms: ms(start.elapsed()),
            count: 1,
        };
        shared.log.push(denial);
        pending.note("redirect not forwarded".into());
        drop(resp);
        return refusal(StatusCode::FORBIDDEN, &reason);
    }

    // A credentialed host's body must be scannable for an echoed secret: no content or
    // transfer coding the gateway does not undo.
    if tls.is_some()
        && let Some(why) = encoded_body(resp.headers())
    {
        let reason = redact(&format!(
            "response from {target} refused: {why} (the body could not be scanned for an echoed credential)"
        ));
        pending.refuse(reason.clone());
        drop(resp);
        return refusal(StatusCode::BAD_GATEWAY, &reason);
    }

    *lock(&pending.upstream) = Some(up);
    pending.reusable.store(!has_body, Ordering::SeqCst);
    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers);
    let rbody = match &tls {
        Some(tls) => {
            // The status line's reason phrase is the canonical one: the upstream's own text
            // could carry the secret.
            rparts.extensions.remove::<hyper::ext::ReasonPhrase>();
            let n = crate::intercept::redact_response(tls, &mut rparts.headers);
            if n > 0 {
                pending.note(format!(
                    "{n} response header(s) echoing a credential removed"
                ));
            }
            MaskedBody::new(rbody, tls, pending.masked.clone()).boxed()
        }
        None => rbody.map_err(BoxError::from).boxed(),
    };
    if !meter.take(Dir::Down, head_bytes(&rparts.headers) + 16) {
        return refusal(StatusCode::FORBIDDEN, "max_bytes_down exceeded");
    }
    let body = MeteredBody {
        inner: rbody,
        meter,
        dir: Dir::Down,
        _keep: pending,
    };
    Response::from_parts(rparts, body.boxed())
}

/// Methods whose request body an upstream may leave unread: a body on one of them, to a
/// credentialed host, is refused.
const BODILESS_METHODS: [&str; 6] = ["GET", "HEAD", "OPTIONS", "DELETE", "TRACE", "TRACK"];

/// Why a response body would arrive encoded (a content coding other than `identity`, or a
/// transfer coding other than `chunked`), or `None`.
fn encoded_body(h: &HeaderMap) -> Option<String> {
    let codings = |name: header::HeaderName, fine: &str| -> Option<String> {
        h.get_all(&name)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .find(|c| !c.is_empty() && c != fine)
            .map(|c| format!("{name}: {}", sanitize(&c, 40)))
    };
    codings(header::CONTENT_ENCODING, "identity")
        .or_else(|| codings(header::TRANSFER_ENCODING, "chunked"))
}

/// Checks every `Location` and `Content-Location` header of a response from `target`: each
/// must be unique, parse, and stay on `target` or pass [`Shared::vet`]. Returns the refused
/// destination (host, port), why, and the address that caused it.
async fn check_locations(
    shared: &Shared,
    target: &Target,
    headers: &HeaderMap,
) -> Option<(String, u16, String, Option<IpAddr>)> {
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let values: Vec<&HeaderValue> = headers.get_all(&name).iter().collect();
        if values.len() > 1 {
            return Some((String::new(), 0, format!("several {name} headers"), None));
        }
        let Some(loc) = values.first() else { continue };
        match redirect_target(loc.as_bytes()) {
            Ok(None) => {}
            Ok(Some(t)) if t == *target => {}
            Ok(Some(t)) => {
                if let Err(r) = shared.vet(&t).await {
                    return Some((
                        t.host.to_string(),
                        t.port,
                        format!("{name}: {}", r.reason),
                        r.address,
                    ));
                }
            }
            Err(reason) => return Some((String::new(), 0, format!("{name}: {reason}"), None)),
        }
    }
    None
}
