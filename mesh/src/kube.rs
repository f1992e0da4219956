//! The Kubernetes source of the mesh: Pods, Services, EndpointSlices,
//! Nodes, Istio AuthorizationPolicies, PeerAuthentications, ServiceEntries
//! and WorkloadEntries, and Gateway API Gateways, converted to the mesh
//! model.

/// Implements what `kube::Api` needs of a custom resource type whose
/// `metadata` field is its `ObjectMeta`: its group, version, kind and
/// plural, and its scope (`NamespaceResourceScope` or
/// `ClusterResourceScope`). With `with spec`, also a `Serialize` that
/// writes `apiVersion` and `kind` beside `metadata` and `spec`, which the
/// API server needs on create.
macro_rules! custom_resource {
    ($type:ident: $group:literal / $version:literal, $kind:literal, $plural:literal, $scope:ident) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::$scope;
        }

        impl k8s_openapi::Metadata for $type {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
    ($type:ident: $group:literal / $version:literal, $kind:literal, $plural:literal, $scope:ident, with spec) => {
        custom_resource!($type: $group / $version, $kind, $plural, $scope);

        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeStruct;
                let mut object = serializer.serialize_struct($kind, 4)?;
                object.serialize_field("apiVersion", concat!($group, "/", $version))?;
                object.serialize_field("kind", $kind)?;
                object.serialize_field("metadata", &self.metadata)?;
                object.serialize_field("spec", &self.spec)?;
                object.end()
            }
        }
    };
}

pub mod convert;
pub mod gateway_crd;
pub mod peer_authentication_crd;
pub mod policy_crd;
pub mod service_entry_crd;
pub mod source;
pub mod workload_entry_crd;
