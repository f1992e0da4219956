//! How an error is printed for a person: the error and each of its causes,
//! once each. Every error type in the workspace describes only its own layer
//! and hands its cause out through [`Error::source`]; a log line, a `main`
//! or a response body that printed only the outer message would lose the
//! cause, and one that printed the message and the sources of an error that
//! also repeated them would say each cause twice. [`ErrorChain`] is the one
//! place that walks the chain. It lives here because every crate that
//! prints errors depends on this one.
//!
//! Some foreign errors (kube's, for one) print their cause and also return
//! it; a cause whose text the level above already printed is not printed
//! again, so their chains read once too.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

/// Displays an error followed by each of its sources, joined with `": "`,
/// as `anyhow` prints with `{:#}`: `reading root file ./root.pem: No such
/// file or directory (os error 2)`. A source whose text is already part of
/// the level above it, or is empty, is left out.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !text.is_empty() && !above.contains(&text) {
                write!(f, ": {text}")?;
            }
            above = text;
            cause = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How a binary's `main` ends on the outcome of its work: success, or the
/// error's chain on stderr after `program: `, and failure. `anyhow` errors
/// and the workspace's own both convert.
pub fn exit_code<E>(program: &str, result: Result<(), E>) -> ExitCode
where
    E: Into<Box<dyn Error + Send + Sync>>,
{
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let error: Box<dyn Error + Send + Sync> = error.into();
            eprintln!("{program}: {}", ErrorChain(&*error));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading root file {path}")]
    struct RootRead {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_printed_once_after_the_error() {
        let error = RootRead {
            path: "./root.pem",
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(
            ErrorChain(&error).to_string(),
            "reading root file ./root.pem: no such file"
        );
    }

    /// A foreign error in the style this workspace avoids: its message
    /// repeats the cause it also returns.
    #[derive(Debug, thiserror::Error)]
    #[error("list failed: {0}")]
    struct Repeating(#[source] RootRead);

    #[test]
    fn a_cause_the_level_above_already_printed_is_not_printed_again() {
        let error = Repeating(RootRead {
            path: "./root.pem",
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
        assert_eq!(
            ErrorChain(&error).to_string(),
            "list failed: reading root file ./root.pem: no such file"
        );
    }

    #[test]
    fn an_error_without_a_source_is_printed_alone() {
        let error = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(ErrorChain(&error).to_string(), "no such file");
    }
}
