//! How a runner (`agentjail run --results-on-lifeline`) hands a run's results to
//! `agentjail serve`, and how the service keeps the runner's lease alive: over its lifeline, a
//! Unix socket whose other end only the service holds, both ways as frames of a one-byte tag, an 8-byte little-endian length and that many bytes. The
//! runner first announces, just before it starts the sandbox, that the command may run from
//! now on (an empty [`STARTING`] frame: a runner that dies without a report before it ran
//! nothing, one that dies after it leaves an unknown outcome); after the run it sends the
//! verified artifact (status `ok` only), then the signed receipt (when it signs one), then the
//! report, always last; nothing of the run is written to a file. The
//! sandbox never holds the socket: the sandbox's init puts `/dev/null` on its own stdin first
//! thing (it is cloned with the runner's descriptors), the command gets `/dev/null` as stdin,
//! and every other inherited descriptor is close-on-exec. The service takes the first frame of
//! each kind, stops at the first report, and checks the artifact against the report's digest.
//!
//! The other way, after the manifest line, a fleet executor sends [`LEASE`] frames (a runner
//! started with `--lease-until`): each renewal of the run's lease moves the time by which the
//! runner must have killed its sandbox, on the host's `CLOCK_BOOTTIME` (which, unlike the
//! monotonic clock, counts a suspended host). Renewals that stop arriving (the executor paused,
//! cut off or stuck) end the payload by the runner's own clock, before the lease can be taken
//! over (docs/deploy.md, "Leases and fencing"). Anything else on that direction ends the run.
//!
//! While the run goes on, a runner whose service asked for them ([`LIVE_DENIALS_ENV`] in its
//! environment) sends each denial as the engine records it, a [`DENIAL`] frame (the first of
//! each distinct kind and detail, at most [`MAX_LIVE_DENIALS`]), between [`STARTING`] and the
//! artifact. Only then: a service older than the frame ends its reading at a tag it does not
//! know, and would lose the report that follows.

/// The sandbox is about to start (empty body): from here on the command may run.
pub const STARTING: u8 = b'S';
/// The verified artifact's bytes.
pub const ARTIFACT: u8 = b'A';
/// The signed receipt (DSSE envelope JSON).
pub const RECEIPT: u8 = b'C';
/// The run report (JSON); the last frame.
pub const REPORT: u8 = b'R';

/// The workspace checkpoint collected after the run (body: the tar archive whose sha256 is the
/// report's `workspace.sha256`), sent before the receipt and only for a manifest whose
/// `workspace` has `collect: true` and whose `session` is set (a service's session cell: a
/// service that asks for a checkpoint reads this frame; an older one never sets `session`).
/// Bounded by the reader at [`workspace_frame_limit`].
pub const WORKSPACE: u8 = b'W';

/// The most a [`WORKSPACE`] frame may take for a workspace of at most `max_bytes` of content
/// in at most `max_files` entries: the content, plus each entry's tar header and padding (two
/// 512-byte blocks at most) and the archive's end (two blocks, rounded up to 10 KiB records).
pub fn workspace_frame_limit(max_bytes: u64, max_files: u64) -> u64 {
    max_bytes
        .saturating_add(max_files.saturating_add(2).saturating_mul(1024))
        .saturating_add(10 * 1024)
}

/// A denial as it was recorded, while the run goes on (body: the report's `Denial` as JSON,
/// `{"kind": …, "detail": …}`): what the service shows its followers live. The report, at the
/// end, stays the run's account of its denials.
pub const DENIAL: u8 = b'D';

/// Most [`DENIAL`] frames of one run: each distinct denial is sent once, and these first ones
/// only (the report counts every refusal).
pub const MAX_LIVE_DENIALS: usize = 64;

/// Set to `1` in the runner's environment by a service that reads [`DENIAL`] frames: a runner
/// sends them only then (an older service would stop reading at the first one). An older
/// runner ignores it and sends none.
pub const LIVE_DENIALS_ENV: &str = "AGENTJAIL_LIVE_DENIALS";

/// Service to runner: the lease's new end (body: 8 bytes, little-endian nanoseconds of
/// `CLOCK_BOOTTIME`), by which the runner kills its sandbox unless another renewal came.
pub const LEASE: u8 = b'L';

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

/// A whole [`LEASE`] frame: the lease ends at `until_ns` (`CLOCK_BOOTTIME`, nanoseconds).
pub fn lease_frame(until_ns: u64) -> [u8; HEADER_LEN + 8] {
    let mut f = [0u8; HEADER_LEN + 8];
    f[..HEADER_LEN].copy_from_slice(&header(LEASE, 8));
    f[HEADER_LEN..].copy_from_slice(&until_ns.to_le_bytes());
    f
}

/// Reads the whole [`LEASE`] frames at the start of `buf`, drops them from it, and returns
/// the last lease end they carry (None when no whole frame is there yet). `Err` for bytes that
/// are not a lease frame: the runner then ends the run (fail closed).
pub fn take_lease_frames(buf: &mut Vec<u8>) -> Result<Option<u64>, &'static str> {
    let mut last = None;
    let mut at = 0;
    while buf.len() - at >= HEADER_LEN {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&buf[at..at + HEADER_LEN]);
        if parse_header(&h) != (LEASE, 8) {
            return Err("the lifeline carried something other than a lease renewal");
        }
        if buf.len() - at < HEADER_LEN + 8 {
            break;
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&buf[at + HEADER_LEN..at + HEADER_LEN + 8]);
        last = Some(u64::from_le_bytes(n));
        at += HEADER_LEN + 8;
    }
    buf.drain(..at);
    Ok(last)
}

#[cfg(test)]
mod tests {
    #[test]
    fn lease_frames_read_back_whole_and_in_pieces() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&super::lease_frame(7));
        stream.extend_from_slice(&super::lease_frame(u64::MAX - 1));
        // All at once: the last one counts.
        let mut b = stream.clone();
        assert_eq!(super::take_lease_frames(&mut b), Ok(Some(u64::MAX - 1)));
        assert!(b.is_empty());
        // Byte by byte: a frame counts only once whole.
        let mut b = Vec::new();
        let mut seen = Vec::new();
        for byte in stream {
            b.push(byte);
            if let Some(v) = super::take_lease_frames(&mut b).unwrap() {
                seen.push(v);
            }
        }
        assert_eq!(seen, [7, u64::MAX - 1]);
        // Anything else is refused, even in pieces.
        let mut b = super::header(super::REPORT, 8).to_vec();
        assert!(super::take_lease_frames(&mut b).is_err());
        let mut b = super::header(super::LEASE, 9).to_vec();
        assert!(super::take_lease_frames(&mut b).is_err());
    }

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
