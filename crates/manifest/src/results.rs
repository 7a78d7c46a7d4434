//! How a runner (`agentjail run --results-on-lifeline`) hands a run's results to
//! `agentjail serve`: over its lifeline, a Unix socket whose other end only the service holds,
//! as frames of a one-byte tag, an 8-byte little-endian length and that many bytes. The
//! runner first announces, just before it starts the sandbox, that the command may run from
//! now on (an empty [`STARTING`] frame: a runner that dies without a report before it ran
//! nothing, one that dies after it leaves an unknown outcome); after the run it sends the
//! verified artifact (status `ok` only), then the signed receipt (when it signs one), then the
//! report, always last; nothing of the run is written to a file. The
//! sandbox never holds the socket: the sandbox's init puts `/dev/null` on its own stdin first
//! thing (it is cloned with the runner's descriptors), the command gets `/dev/null` as stdin,
//! and every other inherited descriptor is close-on-exec. The service takes the first frame of
//! each kind, stops at the first report, and checks the artifact against the report's digest.

/// The sandbox is about to start (empty body): from here on the command may run.
pub const STARTING: u8 = b'S';
/// The verified artifact's bytes.
pub const ARTIFACT: u8 = b'A';
/// The signed receipt (DSSE envelope JSON).
pub const RECEIPT: u8 = b'C';
/// The run report (JSON); the last frame.
pub const REPORT: u8 = b'R';

/// Length of a frame's header: the tag and the body's length.
pub const HEADER_LEN: usize = 9;

/// A frame's header.
pub fn header(tag: u8, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = tag;
    h[1..].copy_from_slice(&len.to_le_bytes());
    h
}

/// The tag and body length of a frame's header.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> (u8, u64) {
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[1..]);
    (h[0], u64::from_le_bytes(len))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_header_reads_back() {
        for (tag, len) in [
            (super::REPORT, 0u64),
            (super::ARTIFACT, 5 << 20),
            (b'?', u64::MAX),
        ] {
            assert_eq!(super::parse_header(&super::header(tag, len)), (tag, len));
        }
    }
}
