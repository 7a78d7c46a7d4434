//! The one way a test says that a prerequisite is missing. Shared by every test crate of the
//! workspace (`#[path = "../../cli/tests/common/skip.rs"] mod skip;` outside crates/cli).

/// A prerequisite of the calling test is missing (root, a network namespace, runsc, a Python
/// module, a util-linux tool…). Under CI (`CI` set; `.ci/run` exports `CI=true` and installs
/// every prerequisite) this panics with the reason, so that a skip fails CI instead of passing
/// unseen. Elsewhere it prints `SKIP: <why>` on stderr and the caller returns.
#[track_caller]
pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("prerequisite missing under CI: {why}");
    }
    eprintln!("SKIP: {why}");
}
