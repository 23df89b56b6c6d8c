//! Output size limits, enforced while rendering.
//!
//! A template can multiply its output (a partial included ten times that includes another ten
//! times ...), so the limit is checked as bytes are produced: rendering stops at the first byte
//! over the budget instead of building a 100 MiB string and measuring it afterwards.

use std::cell::Cell;
use std::io;

/// The largest user-data a Secret can hold (1 MiB), and the default limit.
pub const SECRET_LIMIT_BYTES: u64 = 1 << 20;

/// With `compression: gzip` the limit applies to the compressed output; the uncompressed text
/// may be this many times larger (typical text compresses 3-5 times), which still bounds memory.
pub const GZIP_EXPANSION: u64 = 16;

/// The output limit of one render and the setting it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// The setting, for error messages.
    pub source: &'static str,
}

/// The source of a limit the config set (`spec.maxOutputBytes`).
pub const CONFIG_LIMIT: &str = "the config's spec.maxOutputBytes";

impl Limit {
    /// The smallest of the Secret limit, the template's and the config's `maxOutputBytes`: a
    /// config may lower the template's limit, never raise it.
    pub fn new(template: Option<u64>, config: Option<u64>) -> Limit {
        let mut limit = Limit {
            bytes: SECRET_LIMIT_BYTES,
            source: "the 1 MiB Secret limit",
        };
        if let Some(bytes) = template.filter(|b| *b < limit.bytes) {
            limit = Limit {
                bytes,
                source: "the template's spec.maxOutputBytes",
            };
        }
        if let Some(bytes) = config.filter(|b| *b < limit.bytes) {
            limit = Limit {
                bytes,
                source: CONFIG_LIMIT,
            };
        }
        limit
    }
}

/// Bytes of text rendered so far in one render, shared by all of its fields.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    cap: u64,
    used: u64,
    exceeded: bool,
}

impl Budget {
    pub(crate) fn new(cap: u64) -> Self {
        Budget {
            cap,
            used: 0,
            exceeded: false,
        }
    }

    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// Bytes used, plus the byte that broke the budget once it is exceeded.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// Bytes that still fit.
    pub(crate) fn left(&self) -> u64 {
        self.cap.saturating_sub(self.used)
    }

    /// Marks the budget exceeded by a value of `n` bytes that a helper refused to build (see
    /// [`HelperOutput`]): the render's size error then reports at least `used + n` bytes.
    pub(crate) fn refuse(&mut self, n: u64) {
        self.used = self.used.saturating_add(n).max(self.cap.saturating_add(1));
        self.exceeded = true;
    }

    /// Takes `n` bytes; false (and marked exceeded) when they do not fit.
    pub(crate) fn take(&mut self, n: usize) -> bool {
        let n = n as u64;
        if self.used + n > self.cap {
            self.used = self.cap + 1;
            self.exceeded = true;
            return false;
        }
        self.used += n;
        true
    }
}

/// A handlebars output into a `String` that fails as soon as the shared budget runs out;
/// handlebars then aborts the render, and the caller turns the failure into `OutputTooLarge`
/// by looking at the budget. Handlebars hands it `&str`, so the text needs no UTF-8 check
/// afterwards.
pub(crate) struct LimitedOutput<'a> {
    pub(crate) buf: String,
    budget: &'a mut Budget,
}

impl<'a> LimitedOutput<'a> {
    /// An empty output with room for `capacity` bytes.
    pub(crate) fn new(budget: &'a mut Budget, capacity: usize) -> Self {
        LimitedOutput {
            buf: String::with_capacity(capacity),
            budget,
        }
    }
}

impl handlebars::Output for LimitedOutput<'_> {
    fn write(&mut self, seg: &str) -> io::Result<()> {
        if !self.budget.take(seg.len()) {
            return Err(io::Error::other("output size limit reached"));
        }
        self.buf.push_str(seg);
        OUTPUT_LEFT.set(self.budget.left());
        Ok(())
    }
}

thread_local! {
    /// Output bytes left in the text rendering on this thread, kept up to date by
    /// [`LimitedOutput`]. Helpers build their results before handlebars writes them, so they
    /// check against this first: a value that cannot fit in what is left of the output is
    /// refused before a byte of it is allocated. A render never yields its thread, so a
    /// thread-local is exactly the running render's.
    static OUTPUT_LEFT: Cell<u64> = const { Cell::new(u64::MAX) };
    /// The size of the value a helper refused, for the engine to report as the render's size
    /// error (handlebars passes helper errors on as text only).
    static REFUSED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// While alive, helpers on this thread see the output left in `budget` (and nothing refused
/// yet); dropping it restores what was there before (unbounded outside a render).
pub(crate) struct HelperOutput {
    before: u64,
}

impl HelperOutput {
    pub(crate) fn start(budget: &Budget) -> Self {
        REFUSED.set(None);
        HelperOutput {
            before: OUTPUT_LEFT.replace(budget.left()),
        }
    }

    /// The size of the value a helper refused during this render, if one did.
    pub(crate) fn refused(&self) -> Option<u64> {
        REFUSED.take()
    }
}

impl Drop for HelperOutput {
    fn drop(&mut self) {
        OUTPUT_LEFT.set(self.before);
        REFUSED.set(None);
    }
}

/// A helper's result of `size` bytes does not fit in the output left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("its result would be {size} bytes, more than the {left} bytes of output left")]
pub(crate) struct DoesNotFit {
    pub(crate) size: u64,
    pub(crate) left: u64,
}

/// Checks that a helper result of `size` bytes fits in the output left, before the helper
/// builds it; a refusal is remembered for [`HelperOutput::refused`].
pub(crate) fn reserve(size: u64) -> Result<(), DoesNotFit> {
    let left = OUTPUT_LEFT.get();
    if size > left {
        REFUSED.set(Some(size));
        return Err(DoesNotFit { size, left });
    }
    Ok(())
}

/// The output left for helpers on this thread (for bounded writers that cannot know their
/// size in advance, like gzip).
pub(crate) fn output_left() -> u64 {
    OUTPUT_LEFT.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use handlebars::Output;

    #[test]
    fn config_lowers_but_never_raises_the_template_limit() {
        assert_eq!(Limit::new(None, None).bytes, SECRET_LIMIT_BYTES);
        let l = Limit::new(Some(1000), Some(2000));
        assert_eq!(
            (l.bytes, l.source),
            (1000, "the template's spec.maxOutputBytes")
        );
        let l = Limit::new(Some(1000), Some(10));
        assert_eq!(
            (l.bytes, l.source),
            (10, "the config's spec.maxOutputBytes")
        );
        let l = Limit::new(Some(5 << 20), None);
        assert_eq!(
            l.bytes, SECRET_LIMIT_BYTES,
            "above the Secret limit is capped"
        );
    }

    #[test]
    fn output_stops_at_the_budget() {
        let mut budget = Budget::new(5);
        let mut w = LimitedOutput::new(&mut budget, 0);
        w.write("abc").unwrap();
        assert!(w.write("def").is_err());
        assert_eq!(w.buf, "abc");
        assert!(budget.exceeded());
        assert_eq!(budget.used(), 6);
    }
}
