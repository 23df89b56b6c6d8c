//! How Kubernetes reads an unquoted YAML scalar. `kubectl apply` turns YAML into JSON with
//! sigs.k8s.io/yaml, which decodes with its copy of go-yaml v2: YAML 1.1 rules, where `0600` is
//! the octal integer 384, `1_000` is 1000, `yes`/`no`/`on`/`off`/`y`/`n` are booleans and `0800`
//! (not octal) the number 800. serde_yaml reads YAML 1.2, where all of those are strings, so a
//! file that lint read as `permissions: "0600"` reached the apiserver as `permissions: 384` and
//! the CRD (`type: string`) refused it. The offline commands decode every plain scalar with
//! these rules instead, so they see the object the apiserver sees.
//!
//! The rules are go-yaml v2's `resolve` (resolve.go) followed by sigs.k8s.io/yaml's JSON
//! conversion: a value that looks like a timestamp stays a string (go-yaml keeps it as text
//! when decoding into an interface), and so do `.inf` and `.nan`, which JSON cannot hold.

use serde_yaml::{Number, Value};

/// The value go-yaml v2 gives the plain (unquoted, untagged) scalar `text`, when it is not the
/// string itself: a boolean, a null, an integer or a float. None: a string.
pub fn resolve_plain(text: &str) -> Option<Value> {
    let first = text.bytes().next()?;
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Some(Value::Bool(true));
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Some(Value::Bool(false));
        }
        "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        _ => {}
    }
    match first {
        b'.' => float(text),
        b'+' | b'-' | b'0'..=b'9' => number(text),
        _ => None,
    }
}

/// An integer or float by go-yaml v2's rules for a scalar starting with a digit or a sign.
fn number(text: &str) -> Option<Value> {
    if looks_like_timestamp(text) {
        return None;
    }
    let plain = text.replace('_', "");
    if let Some(value) = go_parse_int(&plain) {
        return Some(value);
    }
    if yaml_style_float(&plain) {
        return float(&plain);
    }
    // `0b1010` was tried by the base-0 parse already; go-yaml's own `0b` branch adds nothing.
    None
}

/// Go's `strconv.ParseInt(s, 0, 64)`, then `ParseUint(s, 0, 64)`: an optional sign, then
/// `0x`/`0X` hexadecimal, `0o`/`0O` or a leading `0` octal, `0b`/`0B` binary, else decimal.
fn go_parse_int(s: &str) -> Option<Value> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = digits.get(..2).map(str::to_ascii_lowercase);
    let (radix, body) = match lower.as_deref() {
        Some("0x") => (16, &digits[2..]),
        Some("0o") => (8, &digits[2..]),
        Some("0b") => (2, &digits[2..]),
        _ if digits.len() > 1 && digits.starts_with('0') => (8, &digits[1..]),
        _ => (10, digits),
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(body, radix).ok()?;
    if !negative {
        return Some(Value::Number(Number::from(magnitude)));
    }
    // i64::MIN's magnitude is one more than i64::MAX.
    let value = 0i64.checked_sub_unsigned(magnitude)?;
    Some(Value::Number(Number::from(value)))
}

/// go-yaml v2's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", fraction)) => digits(fraction),
        Some((whole, fraction)) => digits(whole) && fraction.bytes().all(|b| b.is_ascii_digit()),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// A finite float in go-yaml's float syntax; infinities and NaN stay text (JSON has none).
fn float(s: &str) -> Option<Value> {
    if !yaml_style_float(s) {
        return None;
    }
    let value: f64 = s.parse().ok()?;
    value
        .is_finite()
        .then(|| Value::Number(Number::from(value)))
}

/// go-yaml v2 tries a timestamp first for text of four digits and a `-` (`2024-01-31`): decoded
/// into an interface, a timestamp stays its text.
fn looks_like_timestamp(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() > 4 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

/// Words for a value YAML 1.1 read differently, for a hint: `the number 384`.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Null => "null".to_owned(),
        Value::Number(n) => format!("the number {n}"),
        other => format!("{other:?}"),
    }
}

/// The hint for a field whose unquoted `text` YAML 1.1 reads as `value`.
pub fn hint(text: &str, value: &Value) -> String {
    format!(
        "YAML 1.1, which kubectl apply uses, reads unquoted `{text}` as {}; quote it: \"{text}\"",
        describe(value)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(i: i64) -> Option<Value> {
        Some(Value::Number(Number::from(i)))
    }

    fn float_value(f: f64) -> Option<Value> {
        Some(Value::Number(Number::from(f)))
    }

    #[test]
    fn plain_scalars_resolve_as_go_yaml_v2_does() {
        let cases: &[(&str, Option<Value>)] = &[
            ("0600", int(384)),
            ("0o600", int(384)),
            ("0O17", int(15)),
            ("0x1F", int(31)),
            ("0b101", int(5)),
            ("-0x10", int(-16)),
            ("+12", int(12)),
            ("1_000", int(1000)),
            ("0_600", int(384)),
            ("600", int(600)),
            ("0", int(0)),
            ("-9223372036854775808", int(i64::MIN)),
            (
                "18446744073709551615",
                Some(Value::Number(Number::from(u64::MAX))),
            ),
            // Not octal: go-yaml falls through to its float syntax.
            ("0800", float_value(800.0)),
            ("09", float_value(9.0)),
            ("1.30", float_value(1.3)),
            (".5", float_value(0.5)),
            ("1e3", float_value(1000.0)),
            ("yes", Some(Value::Bool(true))),
            ("Y", Some(Value::Bool(true))),
            ("on", Some(Value::Bool(true))),
            ("off", Some(Value::Bool(false))),
            ("n", Some(Value::Bool(false))),
            ("NO", Some(Value::Bool(false))),
            ("~", Some(Value::Null)),
            // Strings.
            ("yess", None),
            ("2024-01-31", None),
            ("v1.31.0", None),
            ("1.2.3", None),
            ("0x", None),
            ("08x", None),
            ("-", None),
            (".inf", None),
            (".", None),
            ("1e400", None),
            ("0600 ", None),
            ("onboard", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(&resolve_plain(text), expected, "{text:?}");
        }
    }

    #[test]
    fn the_hint_says_why_and_how_to_fix() {
        assert_eq!(
            hint("0600", &Value::Number(Number::from(384))),
            "YAML 1.1, which kubectl apply uses, reads unquoted `0600` as the number 384; quote it: \"0600\""
        );
    }
}
