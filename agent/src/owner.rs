//! `user:group` to numeric ids, from the node's own `/etc/passwd` and `/etc/group` (read under
//! the root by `apply`, so a directory root resolves against its own files). `root` and numeric
//! ids need no entry.

use std::collections::BTreeMap;

/// The users and groups of a node.
#[derive(Debug, Default)]
pub struct Owners {
    /// User name → (uid, primary gid).
    users: BTreeMap<String, (u32, u32)>,
    /// Group name → gid.
    groups: BTreeMap<String, u32>,
}

impl Owners {
    /// Reads the two files' text (`name:x:uid:gid:...` and `name:x:gid:...`).
    pub fn parse(passwd: &str, group: &str) -> Owners {
        let fields = |line: &str| line.split(':').map(str::to_owned).collect::<Vec<_>>();
        let mut owners = Owners::default();
        for f in passwd.lines().map(fields) {
            if let (Some(name), Some(Ok(uid)), Some(Ok(gid))) = (
                f.first(),
                f.get(2).map(|s| s.parse()),
                f.get(3).map(|s| s.parse()),
            ) {
                owners.users.insert(name.clone(), (uid, gid));
            }
        }
        for f in group.lines().map(fields) {
            if let (Some(name), Some(Ok(gid))) = (f.first(), f.get(2).map(|s| s.parse())) {
                owners.groups.insert(name.clone(), gid);
            }
        }
        owners
    }

    /// The ids of `owner` (`user` or `user:group`; a lone user gets its primary group).
    pub fn resolve(&self, owner: &str) -> Result<(u32, u32), String> {
        let (user, group) = match owner.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (owner, None),
        };
        let (uid, primary) = match (user.parse::<u32>(), self.users.get(user)) {
            (Ok(uid), _) => (uid, uid),
            (_, Some(&ids)) => ids,
            _ if user == "root" => (0, 0),
            _ => return Err(format!("no user `{user}` in /etc/passwd")),
        };
        let gid = match group {
            None => primary,
            Some(g) => match (g.parse::<u32>(), self.groups.get(g)) {
                (Ok(gid), _) => gid,
                (_, Some(&gid)) => gid,
                _ if g == "root" => 0,
                _ => return Err(format!("no group `{g}` in /etc/group")),
            },
        };
        Ok((uid, gid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_from_the_nodes_files() {
        let owners = Owners::parse(
            "root:x:0:0::/root:/bin/sh\netcd:x:120:130::/var/lib/etcd:/bin/false\n",
            "root:x:0:\netcd:x:130:\nssl-cert:x:110:\n",
        );
        assert_eq!(owners.resolve("root:root"), Ok((0, 0)));
        assert_eq!(owners.resolve("etcd"), Ok((120, 130)));
        assert_eq!(owners.resolve("etcd:ssl-cert"), Ok((120, 110)));
        assert_eq!(owners.resolve("1000:1001"), Ok((1000, 1001)));
        assert_eq!(
            owners.resolve("nobody-here"),
            Err("no user `nobody-here` in /etc/passwd".into())
        );
        assert_eq!(
            Owners::default().resolve("root:root"),
            Ok((0, 0)),
            "root needs no entry"
        );
    }
}
