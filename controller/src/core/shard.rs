//! Shards: several `bootplate run` replicas splitting one management cluster's configs.
//!
//! A shard is the set of configs matching a label selector (`--shard-selector`), optionally
//! within one namespace (`--namespace`). Each shard elects its own leader on a Lease of its
//! own, named after the shard, so the shards run side by side while the replicas of one shard
//! stand by for each other. A config whose labels stop matching leaves its shard's watch as if
//! it were deleted; [`departure`] tells that apart from a real deletion, so the shard it left
//! does not delete the bootstrap token the shard it joined now owns.

use sha2::{Digest, Sha256};

/// The longest shard slug kept in a Lease name: names stay readable and far below the 253
/// characters a Lease name may have.
const SLUG_LEN: usize = 40;

/// The Lease name of the shard `selector` selects, from the base name `base`:
/// `bootplate-leader-team-a-shard-1-5f0c1e2a` for `team=a,shard=1`. The readable part is the
/// selector reduced to lower-case letters, digits and dashes; the hash of the exact selector
/// keeps two selectors that reduce to the same text (`a=b`, `a==b`) on different Leases.
/// Without a selector the base name is the Lease.
pub(crate) fn lease_name(base: &str, selector: Option<&str>) -> String {
    let Some(selector) = selector else {
        return base.to_owned();
    };
    let mut slug = String::with_capacity(selector.len());
    for c in selector.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.truncate(SLUG_LEN);
    let slug = slug.trim_end_matches('-');
    let hash = hex::encode(&Sha256::digest(selector.as_bytes())[..4]);
    if slug.is_empty() {
        format!("{base}-{hash}")
    } else {
        format!("{base}-{slug}-{hash}")
    }
}

/// Why a config left this replica's config watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Departure {
    /// It is gone: its tokens go with it.
    Deleted,
    /// It still exists but no longer matches this replica's selectors (its labels changed):
    /// the replica whose selectors it matches now owns it and its tokens.
    LeftScope,
}

/// What the watch's deletion of the config with UID `deleted_uid` means, given the UID of the
/// config of that name that exists now (`None` when none does). A config of the same name but
/// another UID is a new object: the old one was deleted.
pub(crate) fn departure(deleted_uid: &str, current_uid: Option<&str>) -> Departure {
    if current_uid == Some(deleted_uid) {
        Departure::LeftScope
    } else {
        Departure::Deleted
    }
}

/// The label selector of the config watch: the watch filter's label and the shard selector,
/// both required (a comma joins requirements; one inside `in (...)` does not matter).
pub(crate) fn config_selector(
    watch_filter: Option<(&str, &str)>,
    shard: Option<&str>,
) -> Option<String> {
    let filter = watch_filter.map(|(label, value)| format!("{label}={value}"));
    match (filter, shard) {
        (Some(filter), Some(shard)) => Some(format!("{filter},{shard}")),
        (Some(filter), None) => Some(filter),
        (None, Some(shard)) => Some(shard.to_owned()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_shard_the_lease_is_the_base_name() {
        assert_eq!(lease_name("bootplate-leader", None), "bootplate-leader");
    }

    #[test]
    fn a_shard_lease_names_the_selector_and_its_hash() {
        let name = lease_name("bootplate-leader", Some("bootplate.dev/shard=a"));
        let hash = hex::encode(&Sha256::digest(b"bootplate.dev/shard=a")[..4]);
        assert_eq!(
            name,
            format!("bootplate-leader-bootplate-dev-shard-a-{hash}")
        );
        let set = lease_name("x", Some("Shard in (A, B)"));
        assert!(set.starts_with("x-shard-in-a-b-"), "{set}");
    }

    #[test]
    fn selectors_that_read_alike_get_different_leases() {
        let pairs = [("a=b", "a==b"), ("a=b", "a!=b"), ("a.b=c", "a-b=c")];
        for (one, other) in pairs {
            assert_ne!(
                lease_name("l", Some(one)),
                lease_name("l", Some(other)),
                "{one} / {other}"
            );
        }
        assert_eq!(lease_name("l", Some("a=b")), lease_name("l", Some("a=b")));
    }

    #[test]
    fn a_long_or_symbol_only_selector_still_gives_a_valid_lease_name() {
        let long = format!("{}=v", "k".repeat(300));
        let name = lease_name("bootplate-leader", Some(&long));
        assert!(
            name.len() <= "bootplate-leader".len() + 1 + SLUG_LEN + 1 + 8,
            "{name}"
        );
        let symbols = lease_name("bootplate-leader", Some("!="));
        assert_eq!(symbols.len(), "bootplate-leader-".len() + 8, "{symbols}");
        for name in [name, symbols] {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !name.ends_with('-'),
                "{name}"
            );
        }
    }

    #[test]
    fn a_config_still_there_left_the_shard_and_a_gone_or_new_one_was_deleted() {
        assert_eq!(departure("u1", Some("u1")), Departure::LeftScope);
        assert_eq!(departure("u1", None), Departure::Deleted);
        assert_eq!(departure("u1", Some("u2")), Departure::Deleted);
    }

    #[test]
    fn the_config_watch_requires_the_watch_filter_and_the_shard() {
        let filter = Some(("cluster.x-k8s.io/watch-filter", "blue"));
        assert_eq!(config_selector(None, None), None);
        assert_eq!(
            config_selector(filter, None).as_deref(),
            Some("cluster.x-k8s.io/watch-filter=blue")
        );
        assert_eq!(
            config_selector(None, Some("shard in (a,b)")).as_deref(),
            Some("shard in (a,b)")
        );
        assert_eq!(
            config_selector(filter, Some("shard=a")).as_deref(),
            Some("cluster.x-k8s.io/watch-filter=blue,shard=a")
        );
    }
}
