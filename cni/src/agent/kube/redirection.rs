//! The `ambient.istio.io/redirection` annotation (KUBERNETES.md A1): its
//! values, the JSON merge patch that writes each, and the write through
//! the `pods/status` subresource, which the agent's role may patch without
//! being allowed to change the pod's spec.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// The annotation readers (istiod, the agent on restart) take as the pod's
/// redirection state.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// The field manager of the agent's writes.
const FIELD_MANAGER: &str = "ztunnel-agent";

/// What the annotation says about a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirection {
    /// Rules installed and ztunnel acked the pod.
    Enabled,
    /// Rules installed; ztunnel has not acked the pod yet.
    Pending,
    /// Not redirected: the annotation is removed.
    Removed,
}

impl Redirection {
    /// The merge patch that writes this state.
    pub fn patch(self) -> Value {
        let value = match self {
            Redirection::Enabled => json!("enabled"),
            Redirection::Pending => json!("pending"),
            Redirection::Removed => Value::Null,
        };
        json!({ "metadata": { "annotations": { REDIRECTION_ANNOTATION: value } } })
    }
}

/// Applies `redirection` to `namespace/name`. Removing it from a pod that
/// no longer exists succeeds.
pub(super) async fn write(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    redirection: Redirection,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch_status(name, &params, &Patch::Merge(redirection.patch()))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status))
            if redirection == Redirection::Removed && status.is_not_found() =>
        {
            Ok(())
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_is_the_merge_patch_of_its_annotation() {
        let cases = [
            (
                Redirection::Enabled,
                r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#,
            ),
            (
                Redirection::Pending,
                r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"pending"}}}"#,
            ),
            (
                Redirection::Removed,
                r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":null}}}"#,
            ),
        ];
        for (redirection, body) in cases {
            assert_eq!(redirection.patch().to_string(), body, "{redirection:?}");
        }
    }
}
