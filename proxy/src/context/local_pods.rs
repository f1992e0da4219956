//! The registry of the pods this process serves, by namespace and pod
//! name, for the same-node path. Generic over what it holds, so that its
//! bookkeeping is tested without a proxy.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, Weak};

use crate::config::WorkloadInfo;

/// The proxies of the pods served on this node, by namespace and pod name:
/// where a connection on the same-node path finds its destination's
/// inbound side. Entries are weak, so a stopped pod's proxy is freed with
/// its last connection whether or not its entry is gone yet.
pub struct LocalPods<P> {
    pods: RwLock<ByNamespace<P>>,
}

/// Pod proxies by namespace, then by pod name.
type ByNamespace<P> = HashMap<Arc<str>, HashMap<Arc<str>, Weak<P>>>;

impl<P> Default for LocalPods<P> {
    fn default() -> Self {
        LocalPods {
            pods: RwLock::default(),
        }
    }
}

impl<P> LocalPods<P> {
    /// Serves `info`'s pod with `proxy` from now on, in place of any
    /// earlier proxy of a pod of that name.
    pub fn insert(&self, info: &WorkloadInfo, proxy: &Arc<P>) {
        self.write()
            .entry(Arc::clone(&info.namespace))
            .or_default()
            .insert(Arc::clone(&info.name), Arc::downgrade(proxy));
    }

    /// Forgets `proxy` as `info`'s pod, unless another proxy replaced it.
    pub fn remove(&self, info: &WorkloadInfo, proxy: &Weak<P>) {
        let mut pods = self.write();
        let Some(names) = pods.get_mut(&*info.namespace) else {
            return;
        };
        if names
            .get(&*info.name)
            .is_some_and(|entry| Weak::ptr_eq(entry, proxy))
        {
            names.remove(&*info.name);
        }
        if names.is_empty() {
            pods.remove(&*info.namespace);
        }
    }

    /// The live proxy of the pod `namespace`/`name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<P>> {
        self.pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(namespace)?
            .get(name)?
            .upgrade()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ByNamespace<P>> {
        // Each change is one insert or remove: a panic elsewhere leaves the
        // map consistent.
        self.pods.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> WorkloadInfo {
        WorkloadInfo {
            namespace: "default".into(),
            name: name.into(),
            service_account: "sa".into(),
        }
    }

    #[test]
    fn a_pod_is_found_until_it_stops_and_a_replacement_survives_its_predecessor() {
        let pods = LocalPods::<&str>::default();
        let first = Arc::new("first");
        pods.insert(&pod("web-0"), &first);
        assert_eq!(pods.get("default", "web-0").as_deref(), Some(&"first"));
        assert!(pods.get("default", "web-1").is_none());
        assert!(pods.get("other", "web-0").is_none());

        // A new pod of the same name (a new netns, or a StatefulSet's next
        // pod) replaces it; the old one's stop must not remove the new one.
        let second = Arc::new("second");
        pods.insert(&pod("web-0"), &second);
        pods.remove(&pod("web-0"), &Arc::downgrade(&first));
        assert_eq!(pods.get("default", "web-0").as_deref(), Some(&"second"));

        // A stopped proxy is not handed out even before its entry goes.
        drop(second);
        assert!(pods.get("default", "web-0").is_none());
        let third = Arc::new("third");
        pods.insert(&pod("web-0"), &third);
        pods.remove(&pod("web-0"), &Arc::downgrade(&third));
        assert!(pods.get("default", "web-0").is_none());
    }
}
