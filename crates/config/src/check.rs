//! The shapes of names, digests, media types and sandbox paths the configuration accepts.

use agentjail_manifest::bounds;

/// Names of tenants, actors and tasks: 1-64 of `a-z 0-9 _ -`.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// `sha256:` and 64 lower-case hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A media type: `type/subtype` of RFC 6838 characters, at most 127 bytes (the configuration's
/// and, in the service, an upload's).
pub fn is_media_type(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
    };
    s.len() <= 127
        && s.split_once('/')
            .map(|(a, b)| ok(a) && ok(b))
            .unwrap_or(false)
}

/// `/input/x` or `/work/x`-style absolute sandbox path with no `.`/`..`/empty components.
pub(crate) fn is_sandbox_path_under(p: &str, roots: &[&str]) -> bool {
    let clean = p.starts_with('/')
        && p.len() <= bounds::MAX_PATH
        && p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && !p.chars().any(|c| c.is_control());
    clean
        && roots.iter().any(|r| {
            p.strip_prefix(r)
                .map(|rest| rest.starts_with('/'))
                .unwrap_or(false)
        })
}
