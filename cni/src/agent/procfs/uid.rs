//! A pod's UID as one canonical value: lowercase hex in the hyphenated
//! 8-4-4-4-12 form Kubernetes gives it in `metadata.uid`, whichever
//! spelling it was read from (the API, or a cgroup path with `_`).

use std::fmt;
use std::str::FromStr;

/// Hex digits in each of a UUID's five groups.
const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];

/// A pod's UID (`metadata.uid`), in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

impl PodUid {
    /// The canonical text, e.g. `1234abcd-5678-90ab-cdef-1234567890ab`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Reads a UUID at the start of `text` whose groups are separated by
    /// one ASCII punctuation character each (`-` from the API and
    /// cgroupfs, `_` from systemd unit names); returns it and how many
    /// bytes it took. What follows is not looked at.
    pub(super) fn parse_prefix(text: &[u8]) -> Option<(PodUid, usize)> {
        let mut canonical = String::with_capacity(36);
        let mut at = 0;
        for (index, digits) in GROUPS.into_iter().enumerate() {
            if index > 0 {
                if !text.get(at)?.is_ascii_punctuation() {
                    return None;
                }
                canonical.push('-');
                at += 1;
            }
            let group = text.get(at..at + digits)?;
            if !group.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            canonical.extend(
                group
                    .iter()
                    .map(|byte| char::from(byte.to_ascii_lowercase())),
            );
            at += digits;
        }
        Some((PodUid(canonical), at))
    }
}

impl FromStr for PodUid {
    type Err = PodUidError;

    /// Accepts exactly the hyphenated form, in either case.
    fn from_str(text: &str) -> Result<PodUid, PodUidError> {
        match PodUid::parse_prefix(text.as_bytes()) {
            Some((uid, taken)) if taken == text.len() && uid.0.eq_ignore_ascii_case(text) => {
                Ok(uid)
            }
            _ => Err(PodUidError::Malformed(text.to_owned())),
        }
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a text is not a pod UID.
#[derive(Debug, thiserror::Error)]
pub enum PodUidError {
    /// Not a hyphenated 8-4-4-4-12 hex UUID.
    #[error("not a pod UID (8-4-4-4-12 hex): {0:?}")]
    Malformed(String),
}
