//! Where the library's log lines go: a sink the host installs, or stderr.
//!
//! Inside the master the library must not write to the terminal on its own: the master
//! installs a sink once ([`set_log_sink`]) and every line lands in the master's log. Until
//! then, warnings and errors go to stderr and the rest is discarded, which is what a library
//! that was given nowhere to log should do.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// How much a line matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Detail for whoever debugs the library.
    Debug,
    /// The publisher's lifecycle: started, stopped, with what.
    Info,
    /// Something an operator should look at: events lost, a flag that silences the stream.
    Warn,
    /// Something failed.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warning",
            Level::Error => "error",
        })
    }
}

type Sink = Arc<dyn Fn(Level, &str) + Send + Sync>;

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

/// Sends every later line of every publisher in the process to `sink`, replacing any sink
/// installed before. The sink is called from the caller's and the publishing thread, so it
/// must be thread-safe; it should not block for long.
pub fn set_log_sink(sink: impl Fn(Level, &str) + Send + Sync + 'static) {
    *SINK.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(sink));
}

/// Forgets the installed sink: warnings and errors go to stderr again.
pub fn remove_log_sink() {
    *SINK.write().unwrap_or_else(PoisonError::into_inner) = None;
}

/// Writes one line to the installed sink, or warnings and errors to stderr.
pub(crate) fn log(level: Level, message: &str) {
    let sink = SINK.read().unwrap_or_else(PoisonError::into_inner).clone();
    match sink {
        Some(sink) => sink(level, message),
        None if level >= Level::Warn => eprintln!("kv_events {level}: {message}"),
        None => {}
    }
}

/// A line that may repeat fast (a send failing on every batch): written at most once per
/// interval, with the number of repeats it stood for.
#[derive(Debug)]
pub(crate) struct RateLimited {
    interval: Duration,
    last_written: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    pub(crate) fn new(interval: Duration) -> RateLimited {
        RateLimited {
            interval,
            last_written: None,
            suppressed: 0,
        }
    }

    /// How many lines were counted but not written since the last one written.
    pub(crate) fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Logs `message()` unless a line went out less than an interval ago; then only counts.
    pub(crate) fn log(&mut self, level: Level, message: impl FnOnce() -> String) {
        let now = Instant::now();
        if self
            .last_written
            .is_some_and(|t| now.duration_since(t) < self.interval)
        {
            self.suppressed += 1;
            return;
        }
        let mut line = message();
        if self.suppressed > 0 {
            line += &format!(
                " ({} more like this since the last report)",
                self.suppressed
            );
        }
        log(level, &line);
        self.last_written = Some(now);
        self.suppressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn repeats_within_an_interval_become_one_line_with_a_count() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&lines);
        set_log_sink(move |level, line| seen.lock().unwrap().push(format!("{level}: {line}")));
        let mut limited = RateLimited::new(Duration::from_secs(3600));
        for _ in 0..1_000_000 {
            limited.log(Level::Warn, || "rate-limit-test send failed".into());
        }
        limited.last_written = Some(Instant::now() - Duration::from_secs(7200));
        limited.log(Level::Warn, || "rate-limit-test send failed".into());
        let lines: Vec<String> = lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("rate-limit-test"))
            .cloned()
            .collect();
        assert_eq!(
            lines,
            [
                "warning: rate-limit-test send failed",
                "warning: rate-limit-test send failed (999999 more like this since the last report)",
            ]
        );
    }
}
