//! The test-only weakening of a sandbox step (`AGENTJAIL_TEST_WEAKEN`), so that a test can show
//! that the escape probes notice a missing layer. A leaf: the steps it weakens (e.g. `sys`'s
//! seccomp filter) ask it; it refers to no other module of the engine.

/// Test-only weakening, honored in debug builds only (a release build compiles it to `false`):
/// `AGENTJAIL_TEST_WEAKEN=seccomp` installs no seccomp filter, so that a test can show that
/// `agentjail selftest`'s probes notice a missing layer (crates/cli/tests/escape.rs).
pub(crate) fn test_weakened(step: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        std::env::var("AGENTJAIL_TEST_WEAKEN")
            .map(|v| v.split(',').any(|s| s == step))
            .unwrap_or(false)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = step;
        false
    }
}
