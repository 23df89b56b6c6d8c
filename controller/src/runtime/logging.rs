//! Log setup. kube-runtime wraps every reconcile in a span carrying the object's reference, so
//! each line a reconcile logs names its object.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::runtime::flags::LogFormat;

/// Library log targets capped whatever the filter says, because their verbose levels print
/// data bootplate must keep secret: handlebars logs the render context (tokens, keys) at debug.
const CAPPED: &[&str] = &["handlebars=error"];

/// Installs the global subscriber: `filter` (else RUST_LOG, else `info`), text or JSON, on stderr.
/// Text has colours only when stderr is a terminal: a Pod's log or a file gets plain text, not
/// escape sequences around every field name.
pub fn init(format: LogFormat, filter: Option<&str>) -> anyhow::Result<()> {
    let mut filter = match filter {
        Some(f) => EnvFilter::try_new(f)?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    for directive in CAPPED {
        filter = filter.add_directive(directive.parse()?);
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
