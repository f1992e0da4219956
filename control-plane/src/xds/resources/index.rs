//! The pods of a snapshot that make workloads, indexed for the selectors
//! of services and policies. What a workload looks like on the wire is
//! `resources.rs`'s.

use std::collections::HashMap;

use ztunnel_mesh::{Labels, MeshSnapshot, Pod, Service};

/// The pods that make workloads, indexed for selectors.
pub(super) struct PodIndex<'a> {
    /// Every pod of the snapshot.
    pods: &'a [Pod],
    /// Positions in `pods` of those that make workloads, in snapshot order.
    pub(super) workloads: Vec<usize>,
    /// uid → workload position.
    by_uid: HashMap<&'a str, usize>,
    /// (namespace, label key, label value) → workload positions.
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<usize>>,
    /// (label key, label value) → workload positions of every namespace.
    by_label_anywhere: HashMap<(&'a str, &'a str), Vec<usize>>,
    /// namespace → workload positions.
    by_namespace: HashMap<&'a str, Vec<usize>>,
}

impl<'a> PodIndex<'a> {
    pub(super) fn new(snapshot: &'a MeshSnapshot) -> Self {
        let mut index = PodIndex {
            pods: snapshot.pods(),
            workloads: Vec::new(),
            by_uid: HashMap::new(),
            by_label: HashMap::new(),
            by_label_anywhere: HashMap::new(),
            by_namespace: HashMap::new(),
        };
        for (at, pod) in snapshot.pods().iter().enumerate() {
            if !makes_workload(pod) {
                continue;
            }
            index.workloads.push(at);
            index.by_uid.insert(pod.uid.as_str(), at);
            index
                .by_namespace
                .entry(pod.namespace.as_str())
                .or_default()
                .push(at);
            for (key, value) in &pod.labels {
                index
                    .by_label
                    .entry((pod.namespace.as_str(), key.as_str(), value.as_str()))
                    .or_default()
                    .push(at);
                index
                    .by_label_anywhere
                    .entry((key.as_str(), value.as_str()))
                    .or_default()
                    .push(at);
            }
        }
        index
    }

    /// Workloads in `namespace` (in every namespace for `None`) that
    /// `selector` matches; all of them for an empty selector. Only the pods
    /// carrying the selector's first label are compared.
    pub(super) fn selected(
        &self,
        namespace: Option<&str>,
        selector: &Labels,
    ) -> Vec<(usize, &'a Pod)> {
        let candidates = match (namespace, selector.iter().next()) {
            (Some(namespace), None) => self.by_namespace.get(namespace).map(Vec::as_slice),
            (None, None) => Some(self.workloads.as_slice()),
            (Some(namespace), Some((key, value))) => self
                .by_label
                .get(&(namespace, key.as_str(), value.as_str()))
                .map(Vec::as_slice),
            (None, Some((key, value))) => self
                .by_label_anywhere
                .get(&(key.as_str(), value.as_str()))
                .map(Vec::as_slice),
        };
        let pods = self.pods;
        candidates
            .into_iter()
            .flatten()
            .filter_map(|at| Some((*at, pods.get(*at)?)))
            .filter(|(_, pod)| pod.is_selected_by(selector))
            .collect()
    }

    /// Workloads that are endpoints of `service`: the pods of its namespace
    /// its selector matches (see `Pod::joins_selector_services`), or the
    /// pods its endpoints name.
    pub(super) fn endpoints(&self, service: &Service) -> Vec<(usize, &'a Pod)> {
        match (&service.selector, &service.endpoints) {
            (Some(selector), _) => self
                .selected(Some(&service.namespace), selector)
                .into_iter()
                .filter(|(_, pod)| pod.joins_selector_services())
                .collect(),
            (None, Some(uids)) => uids
                .iter()
                .filter_map(|uid| self.by_uid.get(uid.as_str()).copied())
                .filter_map(|at| Some((at, self.pods.get(at)?)))
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Whether a pod is a workload: it runs or is about to, and has an address.
fn makes_workload(pod: &Pod) -> bool {
    pod.is_live() && !pod.ips.is_empty()
}
