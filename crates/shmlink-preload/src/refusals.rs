//! The library's refusals in the `SHMLINK_LOG=debug` output: a registration that refuses
//! a client (another uid, not allowed) says so in the server's log with the library's
//! reason, not only in the client's. A minimal `tracing` subscriber, installed when
//! debugging is on, that writes the library's "… refused" events through `log::write_line`.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Writes the library's refusal events to the debug log.
struct Refusals;

/// An event's message and fields as `message (name=value, …)`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            if !self.fields.is_empty() {
                self.fields.push_str(", ");
            }
            let _ = write!(self.fields, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

impl Subscriber for Refusals {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.target() == "shmlink" && *meta.level() <= Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        if line.message.ends_with("refused") {
            crate::log::write_line(format_args!("{} ({})", line.message, line.fields));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the subscriber (once per process; a no-op if another is installed).
pub(crate) fn install() {
    let _ = tracing::subscriber::set_global_default(Refusals);
}
