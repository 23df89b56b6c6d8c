//! Errors of a reconcile: an API failure (retried with backoff) or a [`Blocked`] config.

pub use crate::core::blocked::Blocked;

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A transient API failure: retried with backoff, not shown as a condition.
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A problem the user has to fix (or wait for); shown in the conditions, an event and a
    /// metric.
    #[error("{0}")]
    Blocked(Blocked),
}

impl From<Blocked> for Error {
    fn from(blocked: Blocked) -> Self {
        Error::Blocked(blocked)
    }
}

impl Error {
    /// A state that clears by itself: the config waits.
    pub fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Blocked(Blocked::waiting(reason, message))
    }

    /// A problem someone has to fix.
    pub fn failed(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Blocked(Blocked::failed(reason, message))
    }

    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "ApiError",
            Error::Blocked(blocked) => blocked.reason,
        }
    }
}

/// Whether an API error is "not found".
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Whether an API error is "already exists" or a conflict.
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// The result of a reconcile.
pub type Result<T, E = Error> = std::result::Result<T, E>;
