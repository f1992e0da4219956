//! Fuzzes the node agent's plugin-event server (WIRE.md §6) as far as it
//! reads the request: the route of a method and path (`server::route`),
//! the body of an add or a delete (`server::decode_event`, Go's field
//! names and `net.IPNet` form), and the Kubernetes source's decision on an
//! add (`source::admit`) against one enrolled pod of this node.
//!
//! The input is `METHOD PATH` on its first line, then the body.
//!
//! Properties: no panic; a pod route names the path's two segments, and
//! only GET reaches it; only an empty body is refused as empty; a decoded
//! event encodes to a body that decodes to the same event; an admitted
//! add is recorded with the API's uid and service account, the event's
//! name, namespace, netns and addresses, and a runtime uid that is not the
//! API's is refused.

#![no_main]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::LazyLock;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use ztunnel_cni::agent::enablement::EnablementSettings;
use ztunnel_cni::agent::server::{BodyError, Route, decode_event, route};
use ztunnel_cni::agent::source::{ResolveError, admit};
use ztunnel_cni::event::{CMD_ADD_PATH, CMD_DEL_PATH, CmdAdd, CmdDel};

const NODE: &str = "node-a";
const UID: &str = "uid-1";

/// The API's view of the pod every add is checked against: enrolled by
/// its label, on this node.
static POD: LazyLock<Pod> = LazyLock::new(|| {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": UID,
            "labels": {"istio.io/dataplane-mode": "ambient"}
        },
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "web",
            "containers": [{"name": "app"}]
        }
    }))
    .expect("the fixture is a Pod")
});

fn check_route(method: &Method, path: &str) {
    let pods_path = |rest: &str| {
        rest.split_once('/').is_some_and(|(namespace, name)| {
            !namespace.is_empty() && !name.is_empty() && !name.contains('/')
        })
    };
    let known = path == CMD_ADD_PATH
        || path == CMD_DEL_PATH
        || path.strip_prefix("/pods/").is_some_and(pods_path);
    match route(method, path) {
        Route::Add => assert!(path == CMD_ADD_PATH && method == Method::POST),
        Route::Del => assert!(path == CMD_DEL_PATH && method == Method::POST),
        Route::Pod { namespace, name } => {
            assert_eq!(method, Method::GET);
            assert_eq!(path, format!("/pods/{namespace}/{name}"));
            assert!(!namespace.is_empty() && !name.is_empty() && !name.contains('/'));
        }
        Route::MethodNotAllowed => assert!(known),
        Route::NotFound => assert!(!known, "{method} {path}"),
    }
}

/// The event `body` holds, checked to encode to a body that holds it again.
fn decoded<T>(body: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    match decode_event::<T>(body) {
        Ok(event) => {
            let again = serde_json::to_vec(&event).expect("an event encodes");
            assert_eq!(decode_event::<T>(&again).ok().as_ref(), Some(&event));
            Some(event)
        }
        Err(error) => {
            assert_eq!(matches!(error, BodyError::Empty), body.is_empty());
            None
        }
    }
}

fn check_add(body: &[u8]) {
    let Some(event) = decoded::<CmdAdd>(body) else {
        return;
    };
    let admitted = admit(
        &POD,
        &event,
        NODE,
        &BTreeMap::new(),
        &EnablementSettings::default(),
    );
    match admitted {
        Ok(record) => {
            assert!(event.pod_uid.is_empty() || event.pod_uid == UID);
            assert_eq!(record.uid, UID);
            assert_eq!(record.service_account, "web");
            assert_eq!(
                (&record.namespace, &record.name),
                (&event.pod_namespace, &event.pod_name)
            );
            assert_eq!(record.netns.as_os_str(), event.netns.as_str());
            let ips: Vec<_> = event.ips.iter().map(|ip| ip.address.ip).collect();
            assert_eq!(record.ips, ips);
        }
        Err(ResolveError::UidMismatch { .. }) => {
            assert!(!event.pod_uid.is_empty() && event.pod_uid != UID);
        }
        Err(error) => panic!("an enrolled pod of this node refused: {error}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let (head, body) = match data.iter().position(|&byte| byte == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&[][..], data),
    };
    if let Ok(head) = std::str::from_utf8(head)
        && let Some((method, path)) = head.split_once(' ')
        && let Ok(method) = Method::from_bytes(method.as_bytes())
    {
        check_route(&method, path);
    }
    check_add(body);
    let _ = decoded::<CmdDel>(body);
});
