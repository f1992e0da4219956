//! A test that cannot run here, skipped the one way: [`skip`] prints why,
//! and where `ZTUNNEL_NO_SKIPS` is set (`.ci/run` sets it: root, and every
//! tool, binary and image the tests use, is there) fails the test with
//! that reason instead, so CI never counts a skip as a pass. What is
//! missing is each harness's to say (`netns::unavailable`,
//! `KubeApi::binaries`, `PauseError::CgroupUnavailable`, ...).

use std::fmt::Display;

/// The environment variable that turns a skip into a failure when set to
/// anything but the empty string.
pub const NO_SKIPS: &str = "ZTUNNEL_NO_SKIPS";

/// The calling test cannot run here, for `reason`: prints `SKIPPED:
/// <reason>` on stderr, and the caller then returns early. Where
/// [`NO_SKIPS`] is set it panics with the reason instead, failing the
/// test, so it must be called on the test's own thread (not in a spawned
/// task or thread, whose panic the test would not see).
#[track_caller]
// Failing the test that would skip is this function's job.
#[allow(clippy::panic)]
pub fn skip(reason: impl Display) {
    eprintln!("SKIPPED: {reason}");
    let no_skips = std::env::var_os(NO_SKIPS).map(|value| value.to_string_lossy().into_owned());
    if let Err(failure) = skip_outcome(no_skips.as_deref(), &reason) {
        panic!("{failure}");
    }
}

/// What a skip for `reason` comes to, given [`NO_SKIPS`]'s value (`None`
/// where it is unset): a pass, or the failure's message.
fn skip_outcome(no_skips: Option<&str>, reason: &dyn Display) -> Result<(), String> {
    match no_skips {
        Some(value) if !value.is_empty() => Err(format!(
            "this test would skip, and under {NO_SKIPS} (set by .ci/run, where every \
             capability is present) a skip is a failure: {reason}"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::skip_outcome;

    #[test]
    fn a_skip_passes_unless_the_variable_is_set_and_then_fails_with_the_reason() {
        let failure = "this test would skip, and under ZTUNNEL_NO_SKIPS (set by .ci/run, \
                       where every capability is present) a skip is a failure: not root";
        #[rustfmt::skip]
        let cases: [(&str, Option<&str>, Result<(), String>); 4] = [
            ("unset: the test passes, the reason printed", None, Ok(())),
            ("set empty: as unset, so `VAR= cargo test` skips", Some(""), Ok(())),
            ("set: the skip is a failure with its reason", Some("1"), Err(failure.to_owned())),
            ("any non-empty value counts, not only 1", Some("0"), Err(failure.to_owned())),
        ];
        for (why, no_skips, want) in cases {
            assert_eq!(skip_outcome(no_skips, &"not root"), want, "{why}");
        }
    }
}
