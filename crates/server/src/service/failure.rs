//! [`Failure`]: why a service call did not succeed (a policy refusal, or an internal error
//! whose detail stays in the log).

pub use crate::policy::Refusal;
use crate::storage::store::StoreError;

/// Why a service call did not succeed.
#[derive(Debug)]
pub enum Failure {
    /// Policy (or the transport's parsing) refused the request; audited and counted.
    Refused(Refusal),
    /// The service could not complete it (store, randomness); the detail is in the log.
    Internal,
    /// The shared database cannot be reached now (restarting, connection lost); retry later.
    Unavailable,
}

impl Failure {
    /// The stable machine code: the refusal's, or `internal`.
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Refused(r) => r.code(),
            Failure::Internal => "internal",
            Failure::Unavailable => "unavailable",
        }
    }
    /// What went wrong, for a person (never internal detail).
    pub fn detail(&self) -> String {
        match self {
            Failure::Refused(r) => r.detail(),
            Failure::Internal => {
                "the service could not complete the request; the details are in its log".into()
            }
            Failure::Unavailable => {
                "the service's database cannot be reached right now; retry later".into()
            }
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store error");
        match e {
            StoreError::Unavailable(_) => Failure::Unavailable,
            _ => Failure::Internal,
        }
    }
}
