//! What the root publisher writes, one case per line with its reason.

use super::*;

const ROOT: &str = "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n";

fn configmap(data: Option<&[(&str, &str)]>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            namespace: Some("apps".to_owned()),
            resource_version: Some("42".to_owned()),
            ..ObjectMeta::default()
        },
        data: data.map(|entries| {
            entries
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        }),
        ..ConfigMap::default()
    }
}

#[test]
fn only_the_root_key_is_compared_and_written() {
    let created = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            namespace: Some("apps".to_owned()),
            labels: Some([("istio.io/config".to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some([(ROOT_CERT_KEY.to_owned(), ROOT.to_owned())].into()),
        ..ConfigMap::default()
    };
    let cases = [
        (None, Some(Write::Create(created)), "absent: created"),
        (
            Some(configmap(Some(&[(ROOT_CERT_KEY, ROOT)]))),
            None,
            "holds the root: nothing to write",
        ),
        (
            Some(configmap(Some(&[(ROOT_CERT_KEY, ROOT), ("extra", "x")]))),
            None,
            "other keys are not ours to remove",
        ),
        (
            Some(configmap(Some(&[(ROOT_CERT_KEY, "edited")]))),
            Some(Write::Update(configmap(Some(&[(ROOT_CERT_KEY, ROOT)])))),
            "another root: put back, on the version read",
        ),
        (
            Some(configmap(Some(&[("extra", "x")]))),
            Some(Write::Update(configmap(Some(&[
                (ROOT_CERT_KEY, ROOT),
                ("extra", "x"),
            ])))),
            "the key removed: added back, the other key kept",
        ),
        (
            Some(configmap(None)),
            Some(Write::Update(configmap(Some(&[(ROOT_CERT_KEY, ROOT)])))),
            "no data at all",
        ),
    ];
    for (existing, expected, reason) in cases {
        assert_eq!(
            desired_write(existing.as_ref(), "apps", ROOT),
            expected,
            "{reason}"
        );
    }
}
