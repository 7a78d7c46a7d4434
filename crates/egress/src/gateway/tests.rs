//! The unit tests of [`super`] (the proxy): header handling, redirects, limits.

use super::forward::strip_hop_by_hop;
use super::*;
use hyper::header::HeaderMap;

#[test]
fn hop_by_hop_headers_are_stripped() {
    let mut h = HeaderMap::new();
    h.insert(
        "connection",
        HeaderValue::from_static("x-secret-hop, keep-alive"),
    );
    h.insert("x-secret-hop", HeaderValue::from_static("1"));
    h.insert("proxy-authorization", HeaderValue::from_static("Basic abc"));
    h.insert("accept", HeaderValue::from_static("*/*"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.len(), 1);
    assert!(h.contains_key("accept"));
}

#[test]
fn refusal_has_header_and_body() {
    let r = refusal(
        StatusCode::FORBIDDEN,
        "host evil.test is not in the allowlist\r\n",
    );
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.headers().get(DENIED_HEADER).unwrap(),
        "host evil.test is not in the allowlist??"
    );
}

#[test]
fn default_limits_are_sane() {
    let l = GatewayLimits::default();
    assert!(l.max_bytes_up > 0 && l.max_bytes_down >= l.max_bytes_up);
    assert!(l.max_concurrent_connections > 0);
    assert!(l.connect_timeout < l.max_connection_time);
}
