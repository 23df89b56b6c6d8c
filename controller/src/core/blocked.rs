//! Why a config cannot be made ready now: a condition reason and a message for people.

/// A problem that stops a config from becoming ready, shown in its `Ready` and
/// `DataSecretAvailable` conditions, an event and a metric. Neither field ever holds secret
/// material.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// A `crd_types::conditions::reason` constant.
    pub reason: &'static str,
    /// What is wrong, naming the object and field.
    pub message: String,
    /// Whether the problem is expected to clear by itself (waiting) rather than needing a fix.
    pub waiting: bool,
}

impl Blocked {
    /// A state that clears by itself: the config waits.
    pub fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Blocked {
            reason,
            message: message.into(),
            waiting: true,
        }
    }

    /// A problem someone has to fix.
    pub fn failed(reason: &'static str, message: impl Into<String>) -> Self {
        Blocked {
            reason,
            message: message.into(),
            waiting: false,
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
