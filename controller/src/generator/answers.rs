//! The generators' answers kept per config, bounded in entries and bytes.
//!
//! An answer is up to a generator's `maxResponseBytes` (1 MiB at most), and one is kept per
//! config and part: without a bound, a management cluster's configs times their generator parts
//! would keep gigabytes. When the bound is reached, the answers kept longest go first; a config
//! whose answer went asks its generator again at its next render (with the same idempotency key,
//! so a generator that keeps its answers can answer from them).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use render::generator::GeneratedPart;

/// The most answers kept, over all configs.
pub const MAX_ANSWERS: usize = 50_000;
/// The most bytes of answers kept, over all configs (content, names and keys).
pub const MAX_BYTES: usize = 64 * 1024 * 1024;
/// What an entry costs besides its content and names: its bookkeeping, roughly.
const ENTRY_OVERHEAD: usize = 128;

/// What a part's generator answered for an idempotency key.
struct Answer {
    part: String,
    key: String,
    output: Arc<GeneratedPart>,
    /// Its place in the order of insertion.
    seq: u64,
    /// What it counts against [`MAX_BYTES`].
    bytes: usize,
}

/// The answers, by config UID, and their order of insertion.
pub struct Answers {
    by_config: HashMap<String, Vec<Answer>>,
    /// Insertion sequence number → (config UID, part): the oldest first.
    order: BTreeMap<u64, (String, String)>,
    next: u64,
    bytes: usize,
    max_answers: usize,
    max_bytes: usize,
}

impl Default for Answers {
    fn default() -> Self {
        Answers::with_limits(MAX_ANSWERS, MAX_BYTES)
    }
}

impl Answers {
    /// An empty store that keeps at most `max_answers` answers and `max_bytes` bytes.
    pub fn with_limits(max_answers: usize, max_bytes: usize) -> Answers {
        Answers {
            by_config: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            bytes: 0,
            max_answers,
            max_bytes,
        }
    }

    /// What config `uid`'s part `part` was answered for idempotency key `key`, if kept.
    pub fn get(&self, uid: &str, part: &str, key: &str) -> Option<Arc<GeneratedPart>> {
        self.by_config
            .get(uid)?
            .iter()
            .find(|a| a.part == part && a.key == key)
            .map(|a| a.output.clone())
    }

    /// Keeps `output` as config `uid`'s answer for part `part` (replacing the part's older
    /// one), then drops the oldest answers until the store is within its bounds. An answer
    /// larger than the whole bound is not kept.
    pub fn insert(&mut self, uid: &str, part: &str, key: &str, output: Arc<GeneratedPart>) {
        self.remove_part(uid, part);
        let bytes = ENTRY_OVERHEAD + uid.len() + part.len() + key.len() + output.size();
        if bytes > self.max_bytes || self.max_answers == 0 {
            return;
        }
        let seq = self.next;
        self.next += 1;
        self.order.insert(seq, (uid.to_owned(), part.to_owned()));
        self.bytes += bytes;
        self.by_config
            .entry(uid.to_owned())
            .or_default()
            .push(Answer {
                part: part.to_owned(),
                key: key.to_owned(),
                output,
                seq,
                bytes,
            });
        while self.order.len() > self.max_answers || self.bytes > self.max_bytes {
            let Some((_, (uid, part))) = self.order.pop_first() else {
                break;
            };
            self.remove_part(&uid, &part);
        }
    }

    /// Forgets every answer of config `uid`.
    pub fn forget_config(&mut self, uid: &str) {
        for answer in self.by_config.remove(uid).unwrap_or_default() {
            self.order.remove(&answer.seq);
            self.bytes -= answer.bytes;
        }
    }

    /// How many answers and bytes are kept.
    pub fn kept(&self) -> (usize, usize) {
        (self.order.len(), self.bytes)
    }

    fn remove_part(&mut self, uid: &str, part: &str) {
        let Some(answers) = self.by_config.get_mut(uid) else {
            return;
        };
        if let Some(index) = answers.iter().position(|a| a.part == part) {
            let answer = answers.swap_remove(index);
            self.order.remove(&answer.seq);
            self.bytes -= answer.bytes;
        }
        if answers.is_empty() {
            self.by_config.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer with one file of `bytes` bytes.
    fn answer(bytes: usize) -> Arc<GeneratedPart> {
        let body = serde_json::json!({
            "apiVersion": "generator.bootplate.dev/v1alpha1",
            "kind": "GeneratePartResponse",
            "status": "Success",
            "files": [{"path": "/etc/a", "content": "x".repeat(bytes)}],
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        Arc::new(render::generator::parse_response(&bytes, 1 << 24).unwrap())
    }

    #[test]
    fn answers_are_kept_per_part_and_replaced() {
        let mut answers = Answers::default();
        answers.insert("u1", "net", "k1", answer(10));
        assert!(answers.get("u1", "net", "k1").is_some());
        assert!(answers.get("u1", "net", "k2").is_none(), "other inputs");
        answers.insert("u1", "net", "k2", answer(10));
        assert!(answers.get("u1", "net", "k1").is_none(), "replaced");
        assert_eq!(answers.kept().0, 1);
        answers.insert("u1", "disk", "k1", answer(10));
        answers.forget_config("u1");
        assert_eq!(answers.kept(), (0, 0));
    }

    #[test]
    fn the_oldest_answers_go_once_the_entries_or_bytes_are_at_their_bound() {
        let one = ENTRY_OVERHEAD + "u0".len() + "p".len() + "k".len() + "/etc/a".len() + 1000;
        // (case, max answers, max bytes, answers inserted, configs kept, kept bytes at most)
        let cases = [
            ("within both", 10, 10 * one, 5, 0..5, 5 * one),
            ("entries", 3, usize::MAX, 5, 2..5, 3 * one),
            ("bytes", usize::MAX, 2 * one + one / 2, 5, 3..5, 2 * one),
            ("one answer larger than the bound", 10, one - 1, 5, 0..0, 0),
        ];
        for (case, max_answers, max_bytes, inserted, kept, kept_bytes) in cases {
            let mut answers = Answers::with_limits(max_answers, max_bytes);
            for i in 0..inserted {
                answers.insert(&format!("u{i}"), "p", "k", answer(1000));
            }
            for i in 0..inserted {
                let found = answers.get(&format!("u{i}"), "p", "k").is_some();
                assert_eq!(found, kept.contains(&i), "{case}: config u{i}");
            }
            let (count, bytes) = answers.kept();
            assert_eq!(count, kept.len(), "{case}");
            assert!(bytes <= kept_bytes && bytes <= max_bytes, "{case}: {bytes}");
        }
    }

    #[test]
    fn a_hundred_thousand_megabyte_answers_stay_within_the_default_bound() {
        let mut answers = Answers::default();
        let big = answer(1 << 20);
        for i in 0..100_000 {
            answers.insert(&format!("config-{i}"), "net", "key", big.clone());
        }
        let (count, bytes) = answers.kept();
        assert!(bytes <= MAX_BYTES, "{bytes} bytes kept");
        assert!((60..=MAX_ANSWERS).contains(&count), "{count} answers kept");
        assert!(
            answers.get("config-99999", "net", "key").is_some(),
            "the newest stays"
        );
        assert!(
            answers.get("config-0", "net", "key").is_none(),
            "the oldest went"
        );
    }
}
