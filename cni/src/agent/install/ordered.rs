//! A JSON value whose objects keep their keys in the order they were read,
//! so that a CNI configuration file we rewrite keeps the shape its owner
//! gave it. `serde_json::Value` sorts keys unless the `preserve_order`
//! feature is on, and that feature would change the key order of every
//! `Value` in the workspace's build, not only ours.
//!
//! The decisions made on configuration files are in `conf.rs`.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Number;

/// A parsed JSON value with its object keys in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedValue {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// Any number, kept as serde_json reads it.
    Number(Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<OrderedValue>),
    /// An object: its members in document order. A repeated key is kept
    /// twice; [`OrderedValue::get`] finds the first.
    Object(Vec<(String, OrderedValue)>),
}

impl OrderedValue {
    /// Parses JSON text.
    pub fn parse(text: &[u8]) -> Result<OrderedValue, serde_json::Error> {
        serde_json::from_slice(text)
    }

    /// The value of `key` if this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&OrderedValue> {
        self.members()?
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value)
    }

    /// The members, if this is an object.
    pub fn members(&self) -> Option<&[(String, OrderedValue)]> {
        match self {
            OrderedValue::Object(members) => Some(members),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            OrderedValue::String(text) => Some(text),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[OrderedValue]> {
        match self {
            OrderedValue::Array(elements) => Some(elements),
            _ => None,
        }
    }

    /// The same value with keys in serde_json's sorted order, for
    /// comparisons where key order does not matter.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            OrderedValue::Null => serde_json::Value::Null,
            OrderedValue::Bool(flag) => serde_json::Value::Bool(*flag),
            OrderedValue::Number(number) => serde_json::Value::Number(number.clone()),
            OrderedValue::String(text) => serde_json::Value::String(text.clone()),
            OrderedValue::Array(elements) => {
                serde_json::Value::Array(elements.iter().map(OrderedValue::to_value).collect())
            }
            OrderedValue::Object(members) => serde_json::Value::Object(
                members
                    .iter()
                    .map(|(key, value)| (key.clone(), value.to_value()))
                    .collect(),
            ),
        }
    }

    /// Indented JSON text with a final newline, as configuration files are
    /// usually written.
    pub fn to_pretty_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut text = serde_json::to_vec_pretty(self)?;
        text.push(b'\n');
        Ok(text)
    }
}

impl Serialize for OrderedValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OrderedValue::Null => serializer.serialize_unit(),
            OrderedValue::Bool(flag) => serializer.serialize_bool(*flag),
            OrderedValue::Number(number) => number.serialize(serializer),
            OrderedValue::String(text) => serializer.serialize_str(text),
            OrderedValue::Array(elements) => elements.serialize(serializer),
            OrderedValue::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for OrderedValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OrderedVisitor)
    }
}

/// Builds an [`OrderedValue`] from whatever the JSON parser reports.
struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedValue;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Null)
    }

    fn visit_bool<E>(self, flag: bool) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Bool(flag))
    }

    fn visit_i64<E>(self, number: i64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(number.into()))
    }

    fn visit_u64<E>(self, number: u64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(number.into()))
    }

    fn visit_f64<E: de::Error>(self, number: f64) -> Result<OrderedValue, E> {
        Number::from_f64(number)
            .map(OrderedValue::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E>(self, text: &str) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(text.to_owned()))
    }

    fn visit_string<E>(self, text: String) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedValue, A::Error> {
        let mut elements = Vec::new();
        while let Some(element) = seq.next_element()? {
            elements.push(element);
        }
        Ok(OrderedValue::Array(elements))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedValue, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry()? {
            members.push(member);
        }
        Ok(OrderedValue::Object(members))
    }
}
