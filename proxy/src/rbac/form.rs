//! What the written form of a policy needs beyond the derives in `rbac.rs`:
//! the serde of [`StringMatch`], whose presence match the local config
//! file and `/config_dump` spell differently; the policies' texts, held as
//! `Arc<str>`, as plain strings; and the copy the store keeps of a policy
//! read from the local config file. A CIDR's form is `cidr.rs`'s.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, EnumAccess, VariantAccess, Visitor};
use serde::ser::{SerializeTupleVariant, Serializer};
use serde::{Deserialize, Serialize};

use super::{Match, Policy, StringMatch};

/// `#[serde(with)]` for a policy's `Arc<str>` texts: written and read as
/// plain strings. Serde's `rc` feature would do the same, but for every
/// crate of the workspace at once.
pub(super) mod arc_str {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        text: &Arc<str>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(text)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<str>, D::Error> {
        String::deserialize(deserializer).map(Arc::from)
    }
}

/// The local config file's forms: `!Exact "v"`, `!Prefix "v"`, `!Suffix
/// "v"`, or presence written `!Presence`, `!Presence null`, `!Presence []`,
/// `!Presence {}` or a bare `Presence`. Anything else is refused with what
/// a string match looks like.
impl<'de> Deserialize<'de> for StringMatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StringMatchVisitor)
    }
}

#[derive(Deserialize)]
enum StringMatchTag {
    Exact,
    Prefix,
    Suffix,
    Presence,
}

struct StringMatchVisitor;

impl<'de> Visitor<'de> for StringMatchVisitor {
    type Value = StringMatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string match: !Exact, !Prefix, !Suffix or !Presence")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        match text {
            "Presence" => Ok(StringMatch::Presence),
            _ => Err(E::invalid_value(de::Unexpected::Str(text), &self)),
        }
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        let (tag, value) = data.variant::<StringMatchTag>()?;
        let text = |value: A::Variant| value.newtype_variant::<String>().map(Arc::<str>::from);
        match tag {
            StringMatchTag::Exact => text(value).map(StringMatch::Exact),
            StringMatchTag::Prefix => text(value).map(StringMatch::Prefix),
            StringMatchTag::Suffix => text(value).map(StringMatch::Suffix),
            StringMatchTag::Presence => {
                value.newtype_variant::<de::IgnoredAny>()?;
                Ok(StringMatch::Presence)
            }
        }
    }
}

/// `/config_dump`'s forms, istio/ztunnel's: `{"Exact":s}`, `{"Prefix":s}`,
/// `{"Suffix":s}`, and `{"Presence":[]}`, an empty tuple variant, where the
/// local config file takes a unit.
impl Serialize for StringMatch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const NAME: &str = "StringMatch";
        match self {
            StringMatch::Exact(text) => {
                serializer.serialize_newtype_variant(NAME, 0, "Exact", &**text)
            }
            StringMatch::Prefix(text) => {
                serializer.serialize_newtype_variant(NAME, 1, "Prefix", &**text)
            }
            StringMatch::Suffix(text) => {
                serializer.serialize_newtype_variant(NAME, 2, "Suffix", &**text)
            }
            StringMatch::Presence => serializer
                .serialize_tuple_variant(NAME, 3, "Presence", 0)?
                .end(),
        }
    }
}

impl Policy {
    /// A copy that shares no allocation with this policy. The local config
    /// file is parsed on a thread of its own, whose heap must be empty when
    /// it ends (`config/local.rs`, `parse_apart`): the store keeps this
    /// copy, made on the calling thread, not what the parse allocated.
    pub fn deep_copy(&self) -> Policy {
        // The clone's lists are new; only the texts are still shared.
        let mut copy = self.clone();
        copy.name = copy_text(&self.name);
        copy.namespace = copy_text(&self.namespace);
        let matches = copy
            .rules
            .iter_mut()
            .flat_map(|rule| &mut rule.clauses)
            .flat_map(|clause| &mut clause.matches);
        for conditions in matches {
            conditions.copy_texts();
        }
        copy
    }
}

impl Match {
    /// Gives each text of the string and service-account matches an
    /// allocation of its own.
    fn copy_texts(&mut self) {
        let strings = [
            &mut self.namespaces,
            &mut self.not_namespaces,
            &mut self.principals,
            &mut self.not_principals,
        ];
        for condition in strings.into_iter().flatten() {
            if let StringMatch::Exact(text)
            | StringMatch::Prefix(text)
            | StringMatch::Suffix(text) = condition
            {
                *text = copy_text(text);
            }
        }
        let accounts = [&mut self.service_accounts, &mut self.not_service_accounts];
        for account in accounts.into_iter().flatten() {
            account.namespace = copy_text(&account.namespace);
            account.service_account = copy_text(&account.service_account);
        }
    }
}

fn copy_text(text: &Arc<str>) -> Arc<str> {
    Arc::from(&**text)
}
