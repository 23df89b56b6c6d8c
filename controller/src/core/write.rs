//! Whether to write the data Secret, read it first, or leave it.
//!
//! The metadata store spares reads: a Secret it does not hold, of a config this process never
//! rendered (the first render), is written without reading; one whose resourceVersion is the
//! one this controller wrote or checked for the same content is left alone without reading. A
//! config this process rendered before is read first when the store does not show its Secret:
//! the store may not have seen that write yet (a reconcile the write itself triggered), and
//! writing again would only repeat it.

/// What this process remembers of the config's last data Secret.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Written<'a> {
    /// The digest of the content written or found current.
    pub digest: &'a str,
    /// The Secret's resourceVersion then.
    pub version: Option<&'a str>,
}

/// The plan for the data Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// It holds this content at the resourceVersion the store shows: nothing to do.
    Keep(Option<String>),
    /// Read it, and write only when it differs.
    Compare,
    /// Write it without reading.
    Write,
}

/// The plan for content with digest `digest`, when the store shows resourceVersion `stored`
/// and this process remembers `last` (`None`: it never rendered this config).
pub(crate) fn plan(digest: &str, stored: Option<&str>, last: Option<Written<'_>>) -> Plan {
    let known = last.filter(|l| l.digest == digest).and_then(|l| l.version);
    match stored {
        Some(stored) if known == Some(stored) => Plan::Keep(Some(stored.to_owned())),
        Some(_) => Plan::Compare,
        None if last.is_some() => Plan::Compare,
        None => Plan::Write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_secret_gets_its_plan() {
        let same = Some(Written {
            digest: "d1",
            version: Some("5"),
        });
        let other = Some(Written {
            digest: "d0",
            version: Some("5"),
        });
        let cases = [
            ("first render", None, None, Plan::Write),
            ("unchanged", Some("5"), same, Plan::Keep(Some("5".into()))),
            ("touched by someone", Some("6"), same, Plan::Compare),
            ("new content", Some("5"), other, Plan::Compare),
            ("restarted, secret there", Some("5"), None, Plan::Compare),
            ("store behind our write", None, same, Plan::Compare),
        ];
        for (case, stored, last, expected) in cases {
            assert_eq!(plan("d1", stored, last), expected, "{case}");
        }
    }
}
