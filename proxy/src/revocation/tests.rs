use super::*;

#[test]
fn a_missing_file_revokes_nothing_yet_and_a_malformed_one_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crl.pem");
    assert!(matches!(load(&path), Ok(None)));

    std::fs::write(
        &path,
        "-----BEGIN X509 CRL-----\n!!!!\n-----END X509 CRL-----\n",
    )
    .unwrap();
    assert!(matches!(load(&path), Err(CrlError::Parse { .. })));
    std::fs::write(&path, "not a list").unwrap();
    let error = load(&path).unwrap_err();
    assert!(
        ErrorChain(&error).to_string().contains("crl.pem"),
        "{error}"
    );

    // An empty file is a valid file that revokes nothing.
    std::fs::write(&path, "").unwrap();
    assert_eq!(load(&path).unwrap(), Some(Vec::new()));
}
