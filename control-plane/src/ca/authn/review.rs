//! The caller a Kubernetes TokenReview names (KUBERNETES.md F): the API
//! server verified the token; what it says is read here, strictly. The
//! username must be `system:serviceaccount:<namespace>:<name>` with the
//! group `system:serviceaccounts`, and the pod comes from the review's
//! extra fields, which only pod-bound tokens carry: never from the request.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::TokenReviewStatus;

use super::{AuthnError, Caller};

/// The group every service account is in.
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// The prefix of a service account's username.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The extra field naming the pod a token is bound to.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";

/// The extra field carrying that pod's UID.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// The extra field naming the node of that pod (Kubernetes 1.30 on).
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

impl Caller {
    /// The pod-bound service account a TokenReview of `token` authenticated.
    pub fn from_review(status: &TokenReviewStatus, token: &[u8]) -> Result<Caller, AuthnError> {
        if status.authenticated != Some(true) {
            return Err(AuthnError::ReviewRejected);
        }
        let user = status.user.as_ref().ok_or(AuthnError::MalformedClaims)?;
        let username = user.username.as_deref().unwrap_or_default();
        let (namespace, service_account) = username
            .strip_prefix(SERVICE_ACCOUNT_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .ok_or(AuthnError::NotServiceAccount)?;
        let in_group = user
            .groups
            .iter()
            .flatten()
            .any(|group| group == SERVICE_ACCOUNTS_GROUP);
        if !in_group || namespace.is_empty() || service_account.is_empty() {
            return Err(AuthnError::NotServiceAccount);
        }
        let extra = user.extra.as_ref();
        let pod_name = single(extra, EXTRA_POD_NAME)?.ok_or(AuthnError::NotPodBound)?;
        let pod_uid = single(extra, EXTRA_POD_UID)?.ok_or(AuthnError::NotPodBound)?;
        let node_name = single(extra, EXTRA_NODE_NAME)?;
        Ok(Caller {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            pod_name: pod_name.to_owned(),
            pod_uid: pod_uid.to_owned(),
            node_name: node_name.map(str::to_owned),
            expires: super::unverified_expiry(token),
        })
    }
}

/// The one non-empty value of an extra field, `None` when absent; more
/// than one value, or an empty one, is malformed.
fn single<'a>(
    extra: Option<&'a BTreeMap<String, Vec<String>>>,
    key: &str,
) -> Result<Option<&'a str>, AuthnError> {
    match extra.and_then(|extra| extra.get(key)).map(Vec::as_slice) {
        None | Some([]) => Ok(None),
        Some([value]) if !value.is_empty() => Ok(Some(value)),
        Some(_) => Err(AuthnError::MalformedClaims),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    fn status(
        authenticated: bool,
        username: &str,
        groups: &[&str],
        extra: &[(&str, &[&str])],
    ) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            user: Some(UserInfo {
                username: Some(username.to_owned()),
                groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
                extra: Some(
                    extra
                        .iter()
                        .map(|(key, values)| {
                            (
                                (*key).to_owned(),
                                values.iter().map(|v| (*v).to_owned()).collect(),
                            )
                        })
                        .collect(),
                ),
                uid: None,
            }),
            ..TokenReviewStatus::default()
        }
    }

    const SA: &str = "system:serviceaccount:istio-system:ztunnel";
    const GROUPS: &[&str] = &["system:serviceaccounts", "system:authenticated"];

    #[test]
    fn a_pod_bound_review_names_the_pod_and_its_node() {
        let review = status(
            true,
            SA,
            GROUPS,
            &[
                (EXTRA_POD_NAME, &["ztunnel-abc"]),
                (EXTRA_POD_UID, &["uid-1"]),
                (EXTRA_NODE_NAME, &["node-a"]),
            ],
        );
        assert_eq!(
            Caller::from_review(&review, b"not a JWT"),
            Ok(Caller {
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
                pod_name: "ztunnel-abc".into(),
                pod_uid: "uid-1".into(),
                node_name: Some("node-a".into()),
                expires: None,
            })
        );
    }

    #[test]
    fn every_review_that_is_not_a_pod_bound_service_account_is_refused() {
        let pod = [(EXTRA_POD_NAME, &["p"][..]), (EXTRA_POD_UID, &["u"][..])];
        let cases: &[(&str, TokenReviewStatus, AuthnError)] = &[
            (
                "not authenticated",
                status(false, SA, GROUPS, &pod),
                AuthnError::ReviewRejected,
            ),
            (
                "a user, not a service account",
                status(true, "alice", GROUPS, &pod),
                AuthnError::NotServiceAccount,
            ),
            (
                "service-account name without the group",
                status(true, SA, &["system:authenticated"], &pod),
                AuthnError::NotServiceAccount,
            ),
            (
                "empty namespace",
                status(true, "system:serviceaccount::ztunnel", GROUPS, &pod),
                AuthnError::NotServiceAccount,
            ),
            (
                "no pod (a legacy or unbound token)",
                status(true, SA, GROUPS, &[]),
                AuthnError::NotPodBound,
            ),
            (
                "pod name without uid",
                status(true, SA, GROUPS, &[(EXTRA_POD_NAME, &["p"])]),
                AuthnError::NotPodBound,
            ),
            (
                "two pod names",
                status(
                    true,
                    SA,
                    GROUPS,
                    &[(EXTRA_POD_NAME, &["p", "q"]), (EXTRA_POD_UID, &["u"])],
                ),
                AuthnError::MalformedClaims,
            ),
            (
                "empty pod uid",
                status(
                    true,
                    SA,
                    GROUPS,
                    &[(EXTRA_POD_NAME, &["p"]), (EXTRA_POD_UID, &[""])],
                ),
                AuthnError::MalformedClaims,
            ),
        ];
        for (reason, review, expected) in cases {
            assert_eq!(
                Caller::from_review(review, b"").as_ref(),
                Err(expected),
                "{reason}"
            );
        }
        let no_user = TokenReviewStatus {
            authenticated: Some(true),
            ..TokenReviewStatus::default()
        };
        assert_eq!(
            Caller::from_review(&no_user, b""),
            Err(AuthnError::MalformedClaims)
        );
    }
}
