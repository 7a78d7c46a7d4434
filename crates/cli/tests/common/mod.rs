//! Helpers shared by the integration tests that run the `agentjail` binary and look at its
//! exit code and output.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

mod skip;
#[allow(unused_imports)]
pub use skip::skip;

/// What one invocation of the binary produced.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Everything, for an assertion message.
    pub fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `agentjail ARGS` with the caller's data-directory and image-store settings removed, so
/// a developer's own key or store cannot leak into a test.
pub fn agentjail<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_agentjail"))
        .args(args)
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .output()
        .expect("run agentjail");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}
