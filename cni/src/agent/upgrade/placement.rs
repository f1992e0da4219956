//! Which nodes a DaemonSet's pod template places pods on, read as the
//! scheduler reads it: every `nodeSelector` label, and the required node
//! affinity (`requiredDuringSchedulingIgnoredDuringExecution`), whose terms
//! are ORed and whose label expressions and `metadata.name` fields within a
//! term are ANDed (Kubernetes' `nodeaffinity` package). Taints and
//! tolerations are left out: the charts' agents tolerate every taint.
//!
//! Pure: [`Placement::of`] parses a pod spec, [`Placement::selects`] takes
//! the node as plain data. Why the answer matters is `upgrade.rs`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec};

/// The only node field a `matchFields` requirement can name.
const NODE_NAME_FIELD: &str = "metadata.name";

/// Where a pod template may run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// `nodeSelector`: labels the node must carry with exactly these values.
    node_selector: BTreeMap<String, String>,
    /// The required node affinity's terms, any one of which must hold;
    /// `None` when the template has no required affinity.
    required: Option<Vec<Term>>,
}

/// A node as the placement sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// `metadata.name`, which `matchFields` compares.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// One `nodeSelectorTerms` entry: all of its requirements must hold; an
/// empty term holds for no node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    /// `matchExpressions`, over the node's labels.
    labels: Vec<Requirement>,
    /// `matchFields`, over the node's `metadata.name`.
    fields: Vec<FieldRequirement>,
}

/// One `matchExpressions` entry, its values checked as the API server's
/// `labels.NewRequirement` checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    /// The label key.
    key: String,
    /// How the label is compared.
    test: LabelTest,
}

/// A label comparison with its values parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelTest {
    /// Present with one of the values.
    In(Vec<String>),
    /// Absent, or present with none of the values.
    NotIn(Vec<String>),
    /// Present.
    Exists,
    /// Absent.
    DoesNotExist,
    /// Present as an integer greater than this one.
    Gt(i64),
    /// Present as an integer less than this one.
    Lt(i64),
}

/// One `matchFields` entry: the node's name equal (`In`) or not equal
/// (`NotIn`) to one value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    /// The field; only `metadata.name` has a value.
    key: String,
    /// The one value.
    value: String,
    /// `In` (true) or `NotIn` (false).
    equal: bool,
}

impl Placement {
    /// The placement of a pod template; a template without a spec runs on
    /// every node. Refuses requirements the scheduler would refuse.
    pub fn of(spec: Option<&PodSpec>) -> Result<Placement, PlacementError> {
        let Some(spec) = spec else {
            return Ok(Placement::default());
        };
        let required = spec
            .affinity
            .as_ref()
            .and_then(|affinity| affinity.node_affinity.as_ref())
            .and_then(|node| {
                node.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|selector| {
                selector
                    .node_selector_terms
                    .iter()
                    .map(Term::parse)
                    .collect()
            })
            .transpose()?;
        Ok(Placement {
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required,
        })
    }

    /// Whether a pod of this template may run on `node`.
    pub fn selects(&self, node: &NodeFacts) -> bool {
        let labelled = self
            .node_selector
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value));
        labelled
            && self
                .required
                .as_ref()
                .is_none_or(|terms| terms.iter().any(|term| term.holds(node)))
    }
}

impl Term {
    fn parse(term: &NodeSelectorTerm) -> Result<Term, PlacementError> {
        let labels = term
            .match_expressions
            .iter()
            .flatten()
            .map(Requirement::parse)
            .collect::<Result<_, _>>()?;
        let fields = term
            .match_fields
            .iter()
            .flatten()
            .map(FieldRequirement::parse)
            .collect::<Result<_, _>>()?;
        Ok(Term { labels, fields })
    }

    fn holds(&self, node: &NodeFacts) -> bool {
        if self.labels.is_empty() && self.fields.is_empty() {
            return false;
        }
        self.labels
            .iter()
            .all(|requirement| requirement.holds(&node.labels))
            && self.fields.iter().all(|field| field.holds(&node.name))
    }
}

impl Requirement {
    fn parse(requirement: &NodeSelectorRequirement) -> Result<Requirement, PlacementError> {
        let values = requirement.values.clone().unwrap_or_default();
        let invalid = |why: &'static str| PlacementError::Invalid {
            key: requirement.key.clone(),
            operator: requirement.operator.clone(),
            why,
        };
        let integer = |values: &[String]| match values {
            [value] => value
                .parse::<i64>()
                .map_err(|_| invalid("its value is not an integer")),
            _ => Err(invalid("it takes exactly one value")),
        };
        let test = match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(invalid("it takes values")),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(invalid("it takes no values"));
            }
            "In" => LabelTest::In(values),
            "NotIn" => LabelTest::NotIn(values),
            "Exists" => LabelTest::Exists,
            "DoesNotExist" => LabelTest::DoesNotExist,
            "Gt" => LabelTest::Gt(integer(&values)?),
            "Lt" => LabelTest::Lt(integer(&values)?),
            _ => return Err(invalid("no such operator")),
        };
        Ok(Requirement {
            key: requirement.key.clone(),
            test,
        })
    }

    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let number = || value.and_then(|value| value.parse::<i64>().ok());
        match &self.test {
            LabelTest::In(values) => value.is_some_and(|value| values.contains(value)),
            LabelTest::NotIn(values) => !value.is_some_and(|value| values.contains(value)),
            LabelTest::Exists => value.is_some(),
            LabelTest::DoesNotExist => value.is_none(),
            LabelTest::Gt(bound) => number().is_some_and(|number| number > *bound),
            LabelTest::Lt(bound) => number().is_some_and(|number| number < *bound),
        }
    }
}

impl FieldRequirement {
    fn parse(requirement: &NodeSelectorRequirement) -> Result<FieldRequirement, PlacementError> {
        let invalid = |why: &'static str| PlacementError::Invalid {
            key: requirement.key.clone(),
            operator: requirement.operator.clone(),
            why,
        };
        let equal = match requirement.operator.as_str() {
            "In" => true,
            "NotIn" => false,
            _ => return Err(invalid("a field takes only In or NotIn")),
        };
        let [value] = requirement.values.as_deref().unwrap_or_default() else {
            return Err(invalid("a field takes exactly one value"));
        };
        Ok(FieldRequirement {
            key: requirement.key.clone(),
            value: value.clone(),
            equal,
        })
    }

    /// As a field selector over the node's fields: a field other than
    /// `metadata.name` has the empty value.
    fn holds(&self, node_name: &str) -> bool {
        let actual = if self.key == NODE_NAME_FIELD {
            node_name
        } else {
            ""
        };
        (actual == self.value) == self.equal
    }
}

/// Why a pod template's placement cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A node affinity requirement the scheduler refuses too.
    #[error("node affinity requirement {key} {operator}: {why}")]
    Invalid {
        /// The label key or field.
        key: String,
        /// The operator as written.
        operator: String,
        /// What is wrong with it.
        why: &'static str,
    },
}
