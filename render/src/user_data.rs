//! How much user-data the clouds accept. Each infrastructure provider hands the data Secret's
//! `value` to its cloud, and each cloud caps it differently: some count the bytes as they are,
//! some the base64 text the API carries. `bootplate lint --max-user-data` checks the sample
//! renders against one of these caps (or a byte count), so a template that outgrows a cloud is
//! found before a Machine fails to be created. docs/templates.md has the table with sources.

use std::fmt;
use std::str::FromStr;

/// How a cloud counts the user-data it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// The bytes as rendered (after the template's compression, if any).
    Raw,
    /// The length of their base64 encoding (padded, no line breaks).
    Base64,
}

/// A user-data cap: a named cloud's or a plain byte count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDataLimit {
    /// `aws`, `azure`, … or `BYTES` for a count given as a number.
    pub name: String,
    /// The largest size accepted.
    pub bytes: u64,
    /// What the size is of.
    pub measure: Measure,
}

/// The clouds `--max-user-data` knows: name, cap, what is counted.
pub const CLOUDS: [(&str, u64, Measure); 5] = [
    // EC2: 16 KB of user-data before base64 encoding.
    ("aws", 16 * 1024, Measure::Raw),
    // Azure customData: the decoded binary array at most 65,535 bytes.
    ("azure", 65_535, Measure::Raw),
    // Nova: the base64-encoded user_data at most 65,535 bytes.
    ("openstack", 65_535, Measure::Base64),
    // vSphere: Cluster API's vSphere provider writes the data base64-encoded into
    // guestinfo.userdata, whose value is capped at 64 KiB.
    ("vsphere", 64 * 1024, Measure::Base64),
    // Hetzner Cloud: user_data at most 32 KiB.
    ("hetzner", 32 * 1024, Measure::Raw),
];

/// The error for a `--max-user-data` value that is neither a known cloud nor a byte count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a cloud lint knows (aws, azure, openstack, vsphere, hetzner) nor a byte count from 1 to 1048576"
)]
pub struct UnknownLimit(pub String);

/// The largest plain byte count accepted: a Secret holds at most 1 MiB.
const MAX_BYTES: u64 = 1024 * 1024;

impl FromStr for UserDataLimit {
    type Err = UnknownLimit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        if let Some((name, bytes, measure)) = CLOUDS.iter().find(|(name, ..)| *name == wanted) {
            return Ok(UserDataLimit {
                name: (*name).to_owned(),
                bytes: *bytes,
                measure: *measure,
            });
        }
        // A plain count: at most 7 digits, so the parse cannot overflow before the range check.
        match wanted.parse::<u64>() {
            Ok(bytes @ 1..=MAX_BYTES) if wanted.len() <= 7 => Ok(UserDataLimit {
                name: "BYTES".to_owned(),
                bytes,
                measure: Measure::Raw,
            }),
            _ => Err(UnknownLimit(s.chars().take(64).collect())),
        }
    }
}

impl UserDataLimit {
    /// The size of `data` as this cap counts it.
    pub fn measured(&self, data: &[u8]) -> u64 {
        let n = data.len() as u64;
        match self.measure {
            Measure::Raw => n,
            Measure::Base64 => n.div_ceil(3) * 4,
        }
    }

    /// Whether `data` is over the cap, and by how it was measured: `Some(size)` when it is.
    pub fn exceeded_by(&self, data: &[u8]) -> Option<u64> {
        let size = self.measured(data);
        (size > self.bytes).then_some(size)
    }
}

impl fmt::Display for UserDataLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counted = match self.measure {
            Measure::Raw => "bytes",
            Measure::Base64 => "bytes of base64",
        };
        if self.name == "BYTES" {
            write!(f, "the limit of {} {counted} (--max-user-data)", self.bytes)
        } else {
            write!(
                f,
                "{}'s user-data limit of {} {counted} (--max-user-data {})",
                self.name, self.bytes, self.name
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(s: &str) -> UserDataLimit {
        s.parse().expect(s)
    }

    #[test]
    fn targets_parse_to_their_cap_and_measure() {
        let cases = [
            ("aws", 16_384, Measure::Raw),
            ("AWS", 16_384, Measure::Raw),
            ("azure", 65_535, Measure::Raw),
            ("openstack", 65_535, Measure::Base64),
            ("vsphere", 65_536, Measure::Base64),
            ("hetzner", 32_768, Measure::Raw),
            ("4096", 4096, Measure::Raw),
            ("1048576", 1_048_576, Measure::Raw),
        ];
        for (input, bytes, measure) in cases {
            let l = limit(input);
            assert_eq!((l.bytes, l.measure), (bytes, measure), "{input}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_choices() {
        for bad in [
            "",
            "gcp",
            "0",
            "-1",
            "1048577",
            "99999999999999999999999",
            "16KB",
        ] {
            let err = bad.parse::<UserDataLimit>().unwrap_err();
            assert!(err.to_string().contains("aws, azure"), "{bad}: {err}");
        }
        let long = "x".repeat(10_000);
        assert!(long.parse::<UserDataLimit>().unwrap_err().0.len() <= 64);
    }

    #[test]
    fn sizes_are_counted_as_each_cloud_counts_them() {
        // 48 bytes: 64 characters of base64.
        let data = [b'a'; 48];
        let cases = [("48", None), ("47", Some(48)), ("aws", None)];
        for (input, over) in cases {
            assert_eq!(limit(input).exceeded_by(&data), over, "{input}");
        }
        let base64 = UserDataLimit {
            name: "x".into(),
            bytes: 63,
            measure: Measure::Base64,
        };
        assert_eq!(base64.exceeded_by(&data), Some(64));
        assert_eq!(base64.measured(&[0; 49]), 68);
        // The boundary of a real cap: 49,152 raw bytes are 65,536 of base64 (vSphere's cap
        // exactly); one more byte is over, and over OpenStack's at both sizes.
        assert_eq!(limit("vsphere").exceeded_by(&vec![0; 49_152]), None);
        assert_eq!(limit("vsphere").exceeded_by(&vec![0; 49_153]), Some(65_540));
        assert!(limit("openstack").exceeded_by(&vec![0; 49_152]).is_some());
        assert!(limit("azure").exceeded_by(&vec![0; 49_153]).is_none());
    }

    #[test]
    fn the_message_names_the_cloud_the_cap_and_the_flag() {
        assert_eq!(
            limit("openstack").to_string(),
            "openstack's user-data limit of 65535 bytes of base64 (--max-user-data openstack)"
        );
        assert_eq!(
            limit("2000").to_string(),
            "the limit of 2000 bytes (--max-user-data)"
        );
    }
}
