//! cloud-init's Jinja in a raw cloud-config: what the kubeadm bootstrap provider's users put in
//! their KubeadmConfigSpecs (`name: '{{ ds.meta_data.local_hostname }}'`), carried without
//! letting any other value become Jinja.
//!
//! cloud-init renders a user-data whose first line is `## template: jinja` as a Jinja template
//! before it reads the YAML. A template opts in with `{{cloud_init_jinja}}`, which writes that
//! line and must write the output's first line. From there on every value the template writes
//! goes through [`escape`], so cloud-init prints it as it is, whoever wrote it (the Machine's
//! name, a Secret's file, a variable): the only values left as Jinja are the ones the template
//! writes with `{{yaml_quote_jinja VALUE true}}`, at the places it chose.

use std::borrow::Cow;
use std::cell::Cell;

/// The line cloud-init reads as "render this user-data with Jinja first".
pub const HEADER: &str = "## template: jinja\n";

/// What a Jinja-escaped `{` becomes: an expression that prints `{`.
const BRACE: &str = "{{ '{' }}";

thread_local! {
    /// `{{cloud_init_jinja}}` ran in the text rendering on this thread.
    static JINJA_TEXT: Cell<bool> = const { Cell::new(false) };
    /// `{{yaml_quote_jinja VALUE true}}` is writing its result: the escape function lets the
    /// next value (that result) through unescaped, once.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Starts a text's render with Jinja off.
pub(crate) fn start() {
    JINJA_TEXT.set(false);
    ARMED.set(false);
}

/// Ends a text's render: whether it turned Jinja on (and turns it off).
pub(crate) fn finish() -> bool {
    ARMED.set(false);
    JINJA_TEXT.replace(false)
}

/// `{{cloud_init_jinja}}`: the header line, and every later value of this text escaped.
pub(crate) fn turn_on() -> String {
    JINJA_TEXT.set(true);
    HEADER.to_owned()
}

/// Whether `{{cloud_init_jinja}}` ran in the text rendering on this thread.
pub(crate) fn is_on() -> bool {
    JINJA_TEXT.get()
}

/// Lets the next value through the escape unchanged (`yaml_quote_jinja`'s result, as the
/// helper writes it: never as a subexpression, whose result another helper writes).
pub(crate) fn arm(on: bool) {
    ARMED.set(on);
}

/// The escape function's Jinja half: `value` as written into a Jinja user-data. Nothing changes
/// before `{{cloud_init_jinja}}`; after it, `value` is escaped unless `yaml_quote_jinja … true`
/// is writing it.
pub(crate) fn escape_value(value: &str) -> Cow<'_, str> {
    if !JINJA_TEXT.get() || ARMED.replace(false) {
        return Cow::Borrowed(value);
    }
    escape(value)
}

/// `text` as Jinja prints it back: every `{` that could open a Jinja tag (`{{`, `{%`, `{#`), and
/// a last `{` (the template's next text could complete a tag with it), is written as the
/// expression `{{ '{' }}`. Nothing else in Jinja's syntax starts a tag (cloud-init sets no line
/// statement prefix), so the rest of the text is printed as it is.
pub fn escape(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let opens =
        |i: usize| bytes[i] == b'{' && matches!(bytes.get(i + 1), None | Some(b'{' | b'%' | b'#'));
    let count = (0..bytes.len()).filter(|&i| opens(i)).count();
    if count == 0 {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + count * (BRACE.len() - 1));
    let mut plain = 0;
    for i in (0..bytes.len()).filter(|&i| opens(i)) {
        out.push_str(&text[plain..i]);
        out.push_str(BRACE);
        plain = i + 1;
    }
    out.push_str(&text[plain..]);
    Cow::Owned(out)
}

/// Whether `text` holds a Jinja tag's opening (what cloud-init would expand).
pub fn has_jinja(text: &str) -> bool {
    text.contains("{{") || text.contains("{%") || text.contains("{#")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case: a text and its escape (checked by cloud-init's own Jinja in
    /// tests/tests/kubeadm_compat.rs and the boot proof).
    #[test]
    fn escape_writes_every_tag_opening_as_an_expression() {
        let cases = [
            ("", ""),
            ("plain text, {a: 1}", "plain text, {a: 1}"),
            ("{{ x }}", "{{ '{' }}{ x }}"),
            ("a {% if %} b", "a {{ '{' }}% if %} b"),
            ("{# c #}", "{{ '{' }}# c #}"),
            ("{{{", "{{ '{' }}{{ '{' }}{{ '{' }}"),
            ("ends {", "ends {{ '{' }}"),
            ("é{{", "é{{ '{' }}{{ '{' }}"),
            ("{x{", "{x{{ '{' }}"),
            ("${1%/*} {x}", "${1%/*} {x}"),
        ];
        for (text, escaped) in cases {
            assert_eq!(escape(text), escaped, "{text:?}");
        }
    }

    #[test]
    fn values_are_escaped_only_after_the_header_and_one_pass_is_one_value() {
        start();
        assert_eq!(escape_value("{{ a }}"), "{{ a }}");
        assert_eq!(turn_on(), HEADER);
        assert_eq!(escape_value("{{ a }}"), "{{ '{' }}{ a }}");
        arm(true);
        assert_eq!(escape_value("{{ a }}"), "{{ a }}");
        assert_eq!(escape_value("{{ a }}"), "{{ '{' }}{ a }}");
        assert!(finish());
        assert!(!is_on());
        assert!(has_jinja("{% x") && has_jinja("{#") && !has_jinja("{ {x}"));
    }
}
