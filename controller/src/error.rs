//! Errors and outcomes of a reconcile.

use crd_types::conditions::reason;

/// A problem that stops a config from becoming ready. Each carries a condition reason and a
/// message for people; neither ever contains secret material.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A transient API failure: retried with backoff, not shown as a condition.
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A problem the user has to fix (or wait for); shown in the `Ready` and
    /// `DataSecretAvailable` conditions, an event and a metric.
    #[error("{message}")]
    Blocked {
        /// A `crd_types::conditions::reason` constant.
        reason: &'static str,
        /// What is wrong, naming the object and field.
        message: String,
        /// Whether the problem is expected to clear by itself (waiting) rather than needing a fix.
        waiting: bool,
    },
}

impl Error {
    /// A state that clears by itself: the config waits.
    pub fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Blocked {
            reason,
            message: message.into(),
            waiting: true,
        }
    }

    /// A problem someone has to fix.
    pub fn failed(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Blocked {
            reason,
            message: message.into(),
            waiting: false,
        }
    }

    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "ApiError",
            Error::Blocked { reason, .. } => reason,
        }
    }

    /// Whether this is a render failure of the template (for the template's metrics).
    pub fn is_render_failure(&self) -> bool {
        matches!(
            self.reason(),
            reason::RENDER_FAILED
                | reason::TEMPLATE_INVALID
                | reason::INVALID_VARIABLES
                | reason::OUTPUT_TOO_LARGE
        )
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
