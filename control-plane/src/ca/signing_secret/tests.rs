//! Which Secret wins, and how each is read into signing material: one
//! case per line with its reason. The certificates are generated roots;
//! reading compares certificates, it does not verify signatures (the
//! issuer does), so any distinct certificate can stand for an
//! intermediate here.

use ztunnel_certs::issuer::GeneratedRoot;

use super::*;

/// What a test compares of [`SigningMaterial`]: root, root key present,
/// intermediate chain, extra roots.
type Summary = (String, bool, Option<String>, Option<String>);

fn summary(material: &SigningMaterial) -> Summary {
    (
        material.root_cert_pem.clone(),
        material.root_key_pem.is_some(),
        material
            .intermediate
            .as_ref()
            .map(|intermediate| intermediate.chain_pem.clone()),
        material.extra_roots_pem.clone(),
    )
}

fn cert(name: &str) -> GeneratedRoot {
    generate_root(name, SystemTime::now()).unwrap()
}

fn secret_data(entries: &[(&str, &str)]) -> SecretData {
    entries
        .iter()
        .map(|(key, value)| ((*key).to_owned(), ByteString(value.as_bytes().to_vec())))
        .collect()
}

#[test]
fn the_operators_cacerts_wins_then_the_stored_root_then_a_new_one() {
    let secret = |name: &str| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    let (plugged, stored) = (secret(PLUGGED_SECRET), secret(SELF_SIGNED_SECRET));
    let cases = [
        (
            Some(plugged.clone()),
            Some(stored.clone()),
            Choice::Plugged(plugged.clone()),
            "cacerts wins over istio-ca-secret, as in istiod",
        ),
        (
            Some(plugged.clone()),
            None,
            Choice::Plugged(plugged),
            "cacerts alone",
        ),
        (
            None,
            Some(stored.clone()),
            Choice::Stored(stored),
            "the root a replica or an earlier start stored",
        ),
        (None, None, Choice::Generate, "a fresh namespace: generate"),
    ];
    for (plugged, stored, expected, reason) in cases {
        assert_eq!(choose(plugged, stored), expected, "{reason}");
    }
}

#[test]
fn a_cacerts_signer_that_is_a_root_signs_as_the_root() {
    let (root, old_root) = (cert("root"), cert("old"));
    let both_roots = format!("{}{}", root.cert_pem, old_root.cert_pem);
    let cases = [
        (
            root.cert_pem.as_str(),
            None,
            "the usual self-signed cacerts",
        ),
        (
            &both_roots,
            Some(old_root.cert_pem.clone()),
            "further roots in root-cert.pem are handed out with the root",
        ),
    ];
    for (roots, extra_roots, reason) in cases {
        let entries = [
            (CA_CERT_KEY, root.cert_pem.as_str()),
            (CA_KEY_KEY, &root.key_pem),
            (ROOT_CERT_KEY, roots),
            (CERT_CHAIN_KEY, &root.cert_pem),
        ];
        let material = plugged_material(&secret_data(&entries)).unwrap();
        let expected = (root.cert_pem.clone(), true, None, extra_roots);
        assert_eq!(summary(&material), expected, "{reason}");
    }
}

#[test]
fn a_cacerts_intermediate_is_sent_with_the_chain_above_it_but_not_the_root() {
    let (root, signer, parent) = (cert("root"), cert("intermediate"), cert("parent"));
    let signer_then_root = format!("{}{}", signer.cert_pem, root.cert_pem);
    let parent_then_root = format!("{}{}", parent.cert_pem, root.cert_pem);
    let signer_then_parent = format!("{}{}", signer.cert_pem, parent.cert_pem);
    let cases = [
        (
            Some(signer_then_root.as_str()),
            &signer.cert_pem,
            "the usual cert-chain.pem: itself, then the root",
        ),
        (None, &signer.cert_pem, "no cert-chain.pem"),
        (Some(""), &signer.cert_pem, "an empty one counts as none"),
        (
            Some(&parent_then_root),
            &signer_then_parent,
            "one that starts above the signer: the signer goes first",
        ),
    ];
    for (cert_chain, expected_chain, reason) in cases {
        let mut entries = vec![
            (CA_CERT_KEY, signer.cert_pem.as_str()),
            (CA_KEY_KEY, &signer.key_pem),
            (ROOT_CERT_KEY, &root.cert_pem),
        ];
        entries.extend(cert_chain.map(|chain| (CERT_CHAIN_KEY, chain)));
        let material = plugged_material(&secret_data(&entries)).unwrap();
        let expected = (
            root.cert_pem.clone(),
            false,
            Some(expected_chain.clone()),
            None,
        );
        assert_eq!(summary(&material), expected, "{reason}");
    }
}

#[test]
fn a_malformed_cacerts_is_refused_naming_the_key() {
    let root = cert("root");
    let complete = [
        (CA_CERT_KEY, root.cert_pem.as_str()),
        (CA_KEY_KEY, root.key_pem.as_str()),
        (ROOT_CERT_KEY, root.cert_pem.as_str()),
    ];
    let without = |key: &str| -> Vec<(&str, &str)> {
        complete
            .iter()
            .copied()
            .filter(|(name, _)| *name != key)
            .collect()
    };
    let with = |key: &'static str, value: &'static str| {
        let mut entries = without(key);
        entries.push((key, value));
        entries
    };
    let cases = [
        (without(CA_CERT_KEY), "Secret cacerts has no ca-cert.pem"),
        (without(CA_KEY_KEY), "Secret cacerts has no ca-key.pem"),
        (
            without(ROOT_CERT_KEY),
            "Secret cacerts has no root-cert.pem",
        ),
        (with(CA_CERT_KEY, ""), "Secret cacerts has no ca-cert.pem"),
        (
            with(ROOT_CERT_KEY, "not a certificate"),
            "root-cert.pem in Secret cacerts is not PEM: no certificate",
        ),
    ];
    for (entries, expected) in cases {
        let error = plugged_material(&secret_data(&entries)).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn the_stored_root_round_trips_through_its_secret() {
    let (root, old_root) = (cert("root"), cert("old"));
    let secret = self_signed_secret("istio-system", &root.cert_pem, &root.key_pem);
    assert_eq!(secret.type_.as_deref(), Some("istio.io/ca-root"));
    assert_eq!(secret.metadata.name.as_deref(), Some("istio-ca-secret"));
    let material = self_signed_material(&data(&secret)).unwrap();
    assert_eq!(
        summary(&material),
        (root.cert_pem.clone(), true, None, None)
    );
    assert_eq!(
        material.root_key_pem.as_deref().map(String::as_str),
        Some(root.key_pem.as_str())
    );

    let mut rotated = data(&secret);
    let both_roots = format!("{}{}", old_root.cert_pem, root.cert_pem);
    rotated.insert(
        ROOT_CERT_KEY.to_owned(),
        ByteString(both_roots.into_bytes()),
    );
    assert_eq!(
        summary(&self_signed_material(&rotated).unwrap()),
        (root.cert_pem.clone(), true, None, Some(old_root.cert_pem)),
        "roots istiod left in root-cert.pem are handed out with it"
    );

    let mut keyless = data(&secret);
    keyless.remove(CA_KEY_KEY);
    assert_eq!(
        self_signed_material(&keyless).unwrap_err().to_string(),
        "Secret istio-ca-secret has no ca-key.pem"
    );
}
