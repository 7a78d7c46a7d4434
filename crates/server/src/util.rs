//! Small helpers every layer may use (randomness, the clock); nothing here refers to another
//! module of this crate, so that the storage can use them without reaching up to the state in
//! [`crate::app`] (issue #32: `pg` once called `app::random_hex`, a cycle).

/// Random bytes from the kernel, as lower-case hex.
pub(crate) fn random_hex(n: usize) -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(agentjail_manifest::hex(&buf))
}

/// Unix seconds now (this host's wall clock).
pub(crate) fn now() -> i64 {
    jiff::Timestamp::now().as_second() + test_clock_skew()
}

/// Debug builds only (the tests' binary), a fault-injection hook: the environment variable
/// `AGENTJAIL_TEST_CLOCK_SKEW_SECONDS` shifts this process's wall clock [`now`], so that a
/// test can run a node whose clock is wrong (crates/cli/tests/fleet.rs). Release builds: 0.
#[cfg(debug_assertions)]
fn test_clock_skew() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        std::env::var("AGENTJAIL_TEST_CLOCK_SKEW_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

#[cfg(not(debug_assertions))]
fn test_clock_skew() -> i64 {
    0
}
