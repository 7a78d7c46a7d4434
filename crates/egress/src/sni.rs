//! The first bytes of a CONNECT tunnel: they must be a TLS ClientHello whose server name (SNI)
//! is the CONNECT target, so an allowed tunnel cannot be fronted to another host behind the
//! same address.
//!
//! The ClientHello is reassembled from as many TLS records as the client splits it into, then
//! parsed with the `tls-parser` crate. Nothing is decrypted or answered: the bytes read are
//! forwarded to the destination unchanged once the check passed.

use tls_parser::{
    SNIType, TlsExtension, TlsMessage, TlsMessageHandshake, parse_tls_client_hello_extensions,
    parse_tls_message_handshake,
};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::decision::sanitize;
use crate::host::{Host, parse_host};

/// Largest ClientHello accepted (a real one, post-quantum key shares included, is a few KiB).
pub(crate) const MAX_CLIENT_HELLO: usize = 64 << 10;
/// The largest TLSPlaintext fragment (RFC 8446 section 5.1).
const MAX_RECORD: usize = 1 << 14;
/// `encrypted_client_hello` (RFC 9849): the real server name is encrypted.
const ECH: u16 = 0xfe0d;

/// Why the first flight of a tunnel was refused. `code` is the stable reason tag that starts the
/// decision's reason (`not_tls`, `sni_missing`, `sni_mismatch`, `sni_ech`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) code: &'static str,
    pub(crate) detail: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

fn refused(code: &'static str, detail: impl Into<String>) -> Refused {
    Refused {
        code,
        detail: detail.into(),
    }
}

/// What reading the first flight gave.
#[derive(Debug)]
pub(crate) enum First {
    /// A complete ClientHello: every byte read so far (to forward) and the handshake message.
    Hello { raw: Vec<u8>, hello: Vec<u8> },
    /// The client closed the tunnel before a ClientHello was complete.
    Closed,
}

/// Reads TLS records from `r` until a whole ClientHello handshake message has arrived.
pub(crate) async fn read_client_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<First, Refused> {
    let mut raw: Vec<u8> = Vec::with_capacity(2048);
    let mut hs: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    loop {
        // One record header.
        while raw.len() < pos + 5 {
            if r.read_buf(&mut raw).await.map_err(|_| io_refusal())? == 0 {
                return Ok(First::Closed);
            }
            if pos == 0 && raw.first().is_some_and(|b| *b != 22) {
                return Err(not_tls());
            }
        }
        let h = &raw[pos..pos + 5];
        if h[0] != 22 || h[1] != 3 {
            return Err(not_tls());
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(refused("not_tls", "invalid TLS record length"));
        }
        while raw.len() < pos + 5 + len {
            if r.read_buf(&mut raw).await.map_err(|_| io_refusal())? == 0 {
                return Ok(First::Closed);
            }
        }
        hs.extend_from_slice(&raw[pos + 5..pos + 5 + len]);
        pos += 5 + len;
        if hs[0] != 1 {
            return Err(refused(
                "not_tls",
                "the first handshake message is not a ClientHello",
            ));
        }
        if hs.len() >= 4 {
            let need =
                4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
            if need > MAX_CLIENT_HELLO {
                return Err(refused(
                    "not_tls",
                    format!("ClientHello larger than {MAX_CLIENT_HELLO} bytes"),
                ));
            }
            if hs.len() >= need {
                hs.truncate(need);
                return Ok(First::Hello { raw, hello: hs });
            }
        }
    }
}

fn not_tls() -> Refused {
    refused(
        "not_tls",
        "the tunnel does not start with a TLS ClientHello (only TLS is tunnelled)",
    )
}

fn io_refusal() -> Refused {
    refused(
        "not_tls",
        "the client connection failed before a ClientHello",
    )
}

/// Checks a complete ClientHello handshake message against the CONNECT target `host`.
///
/// - a name target needs exactly one `host_name` SNI equal to it after the same normalisation
///   (IDNA, case, one trailing dot);
/// - an IP-literal target accepts no SNI, or an SNI that is the same IP;
/// - an `encrypted_client_hello` extension, duplicated extensions, several server names or a
///   ClientHello that does not parse are refused.
pub(crate) fn check_client_hello(hello: &[u8], host: &Host) -> Result<(), Refused> {
    let bad = || refused("not_tls", "malformed ClientHello");
    let ch = match parse_tls_message_handshake(hello) {
        Ok(([], TlsMessage::Handshake(TlsMessageHandshake::ClientHello(ch)))) => ch,
        _ => return Err(bad()),
    };
    let exts = match ch.ext {
        None => Vec::new(),
        Some(e) => match parse_tls_client_hello_extensions(e) {
            Ok(([], exts)) => exts,
            _ => return Err(bad()),
        },
    };
    let mut seen: Vec<u16> = Vec::with_capacity(exts.len());
    let mut names: Vec<&[u8]> = Vec::new();
    for ext in &exts {
        let ty = tls_parser::TlsExtensionType::from(ext).0;
        if seen.contains(&ty) {
            return Err(refused("not_tls", "duplicated ClientHello extension"));
        }
        seen.push(ty);
        match ext {
            TlsExtension::SNI(list) => {
                for (t, name) in list {
                    if *t != SNIType::HostName {
                        return Err(refused("sni_mismatch", "unknown server name type"));
                    }
                    names.push(name);
                }
            }
            _ if ty == ECH => {
                return Err(refused(
                    "sni_ech",
                    "encrypted ClientHello (ECH) hides the server name",
                ));
            }
            _ => {}
        }
    }
    let name = match names.as_slice() {
        [] => None,
        [one] => Some(*one),
        _ => {
            return Err(refused(
                "sni_mismatch",
                "several server names in one ClientHello",
            ));
        }
    };
    let Some(name) = name else {
        return match host {
            Host::Ip(_) => Ok(()),
            Host::Name(n) => Err(refused(
                "sni_missing",
                format!("TLS ClientHello without a server name for {n}"),
            )),
        };
    };
    let shown = sanitize(&String::from_utf8_lossy(name), 100);
    let sni = std::str::from_utf8(name)
        .ok()
        .and_then(|s| parse_host(s).ok())
        .ok_or_else(|| refused("sni_mismatch", format!("invalid TLS server name {shown}")))?;
    if &sni == host {
        Ok(())
    } else {
        Err(refused(
            "sni_mismatch",
            format!("TLS server name {sni} is not the CONNECT target {host}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal but well-formed TLS 1.2 ClientHello record with the given extensions.
    fn hello(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]); // random
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut e = Vec::new();
        for (ty, data) in exts {
            e.extend_from_slice(&ty.to_be_bytes());
            e.extend_from_slice(&(data.len() as u16).to_be_bytes());
            e.extend_from_slice(data);
        }
        body.extend_from_slice(&(e.len() as u16).to_be_bytes());
        body.extend_from_slice(&e);
        let mut hs = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        hs.extend_from_slice(&body);
        hs
    }

    fn sni(name: &str) -> (u16, Vec<u8>) {
        let mut v = ((name.len() + 3) as u16).to_be_bytes().to_vec();
        v.push(0);
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name.as_bytes());
        (0, v)
    }

    fn records(hs: &[u8], split: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in hs.chunks(split) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    fn host(s: &str) -> Host {
        parse_host(s).unwrap()
    }

    fn read(bytes: Vec<u8>) -> Result<First, Refused> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(read_client_hello(&mut bytes.as_slice()))
    }

    #[test]
    fn fragmented_hello_is_reassembled_and_checked() {
        let hs = hello(&[sni("Allowed.Test.")]);
        for split in [1, 3, 10, hs.len()] {
            let wire = records(&hs, split);
            match read(wire.clone()).unwrap() {
                First::Hello { raw, hello } => {
                    assert_eq!(raw, wire);
                    assert_eq!(hello, hs);
                    check_client_hello(&hello, &host("allowed.test")).unwrap();
                    assert_eq!(
                        check_client_hello(&hello, &host("other.test"))
                            .unwrap_err()
                            .code,
                        "sni_mismatch"
                    );
                }
                First::Closed => panic!("closed"),
            }
        }
    }

    #[test]
    fn refusals() {
        let code = |exts: &[(u16, Vec<u8>)], h: &str| {
            check_client_hello(&hello(exts), &host(h))
                .err()
                .map(|r| r.code)
        };
        assert_eq!(code(&[], "allowed.test"), Some("sni_missing"));
        assert_eq!(code(&[], "127.0.0.1"), None);
        assert_eq!(code(&[sni("127.0.0.1")], "127.0.0.1"), None);
        assert_eq!(code(&[sni("evil.test")], "127.0.0.1"), Some("sni_mismatch"));
        assert_eq!(
            code(&[sni("allowed.test"), (ECH, vec![0; 8])], "allowed.test"),
            Some("sni_ech")
        );
        assert_eq!(
            code(&[sni("allowed.test"), sni("evil.test")], "allowed.test"),
            Some("not_tls")
        );
        assert_eq!(
            code(&[sni("bad name")], "allowed.test"),
            Some("sni_mismatch")
        );
        assert!(matches!(
            read(b"GET / HTTP/1.1\r\n\r\n".to_vec()),
            Err(Refused {
                code: "not_tls",
                ..
            })
        ));
        assert!(matches!(read(vec![22, 3]), Ok(First::Closed)));
        assert!(read(vec![22, 3, 1, 0, 0]).is_err());
        // A handshake length beyond the bound is refused before it is buffered.
        assert!(read(vec![22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let mut wire = vec![22, 3, 1];
            wire.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            wire.extend_from_slice(&bytes);
            if let Ok(First::Hello { hello, .. }) = read(wire) {
                let _ = check_client_hello(&hello, &host("allowed.test"));
            }
            let _ = check_client_hello(&bytes, &host("allowed.test"));
        }
    }
}
