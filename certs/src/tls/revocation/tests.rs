use std::sync::Barrier;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::KeyUsage;

use super::*;
use crate::tls::TrustRoots;
use crate::tls::verify::verify_chain;

/// A CA of its own, with a name no other CA has (a list applies to the
/// CAs of its issuer's name, so the lists installed here change no other
/// test's verdict), and leaves it signs.
struct Ca {
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Ca {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let number = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("revocation test CA {number}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        der: cert.der().clone(),
        issuer: Issuer::new(params, key),
    }
}

fn leaf(ca: &Ca, serial: u8) -> CertificateDer<'static> {
    let mut params = CertificateParams::default();
    params.serial_number = Some(SerialNumber::from_slice(&[serial]));
    params.subject_alt_names = vec![SanType::URI(
        "spiffe://cluster.local/ns/a/sa/b".try_into().unwrap(),
    )];
    let key = KeyPair::generate().unwrap();
    params.signed_by(&key, &ca.issuer).unwrap().der().clone()
}

/// An intermediate CA that `ca` signs with `serial`, and its certificate.
fn intermediate(ca: &Ca, serial: u8) -> (Ca, CertificateDer<'static>) {
    let mut params = CertificateParams::default();
    params.serial_number = Some(SerialNumber::from_slice(&[serial]));
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        format!("intermediate {serial} of {:?}", ca.der.len()),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let der = params.signed_by(&key, &ca.issuer).unwrap().der().clone();
    let intermediate = Ca {
        der: der.clone(),
        issuer: Issuer::new(params, key),
    };
    (intermediate, der)
}

fn crl_pem(ca: &Ca, revoked: u8) -> String {
    let now = time::OffsetDateTime::now_utc();
    CertificateRevocationListParams {
        this_update: now - time::Duration::hours(1),
        // Already past: a stale list still revokes.
        next_update: now - time::Duration::minutes(1),
        crl_number: SerialNumber::from_slice(&[1]),
        issuing_distribution_point: None,
        revoked_certs: vec![RevokedCertParams {
            serial_number: SerialNumber::from_slice(&[revoked]),
            revocation_time: now - time::Duration::hours(1),
            reason_code: Some(RevocationReason::KeyCompromise),
            invalidity_date: None,
        }],
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(&ca.issuer)
    .unwrap()
    .pem()
    .unwrap()
}

fn verify(ca: &Ca, leaf: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    let roots = TrustRoots::from_der(vec![ca.der.clone()]).unwrap();
    let now = UnixTime::since_unix_epoch(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO),
    );
    let algorithms = crate::tls::provider().signature_verification_algorithms;
    let lists = in_force();
    let usage = KeyUsage::client_auth();
    verify_chain(leaf, &[], &roots, now, usage, &algorithms, lists.as_ref())
}

#[test]
fn a_revoked_peer_is_refused_and_the_others_pass() {
    let ca = ca();
    let (revoked, kept) = (leaf(&ca, 7), leaf(&ca, 8));
    assert!(verify(&ca, &revoked).is_ok(), "before any list");

    let lists = RevocationLists::parse(crl_pem(&ca, 7).as_bytes()).unwrap();
    assert_eq!(lists.len(), 1);
    install(lists);
    let error = verify(&ca, &revoked).unwrap_err();
    assert_eq!(
        error,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)
    );
    assert!(verify(&ca, &kept).is_ok());
    // A peer of a CA without a list is judged as before.
    let other = self::ca();
    assert!(verify(&other, &leaf(&other, 7)).is_ok());
    install(RevocationLists::default());
    assert!(verify(&ca, &revoked).is_ok(), "lists taken out of force");
}

#[test]
fn revocation_files_parse_as_pem_der_or_empty() {
    let ca = ca();
    let pem = crl_pem(&ca, 1);
    assert_eq!(RevocationLists::parse(pem.as_bytes()).unwrap().len(), 1);
    let der = CertificateRevocationListDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(RevocationLists::parse(der.as_ref()).unwrap().len(), 1);
    assert!(RevocationLists::parse(b"").unwrap().is_empty());
    assert!(RevocationLists::parse(b"not a list").is_err());
}

fn lists(ca: &Ca, revoked: u8) -> RevocationLists {
    RevocationLists::parse(crl_pem(ca, revoked).as_bytes()).unwrap()
}

fn roots(ca: &Ca) -> TrustRoots {
    TrustRoots::from_der(vec![ca.der.clone()]).unwrap()
}

/// The chain a handshake that began in `generation` kept.
fn chain(certificates: &[CertificateDer<'static>], generation: u64) -> PeerChain {
    PeerChain::capture(Some(certificates), generation).unwrap()
}

/// Tracks a connection of a peer presenting `certificates`, issued under
/// `ca`, whose handshake began now.
fn track_now(
    registry: &Arc<Revocations>,
    ca: &Ca,
    certificates: &[CertificateDer<'static>],
) -> Tracked {
    let chain = chain(certificates, registry.generation());
    Revocations::track(registry, chain, roots(ca), PeerRole::Client)
}

#[test]
fn an_open_connection_is_told_when_a_list_revokes_its_leaf_and_not_for_other_lists() {
    let registry = Arc::new(Revocations::default());
    let (ca, other) = (ca(), ca());
    let tracked = track_now(&registry, &ca, &[leaf(&ca, 7)]);
    let untouched = [
        (lists(&ca, 8), "its CA's list revoking another serial"),
        (lists(&other, 7), "another CA's list revoking its serial"),
        (RevocationLists::default(), "no list at all"),
    ];
    for (installed, case) in untouched {
        registry.install(installed);
        assert!(!tracked.revocation().is_revoked(), "{case}");
    }
    registry.install(lists(&ca, 7));
    assert!(
        tracked.revocation().is_revoked(),
        "its CA's list revoking its serial"
    );
}

#[test]
fn a_server_peer_is_judged_for_server_auth() {
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    let chain = chain(&[leaf(&ca, 4)], registry.generation());
    let tracked = Revocations::track(&registry, chain, roots(&ca), PeerRole::Server);
    registry.install(lists(&ca, 4));
    assert!(tracked.revocation().is_revoked());
}

#[test]
fn revoking_an_intermediate_tells_every_connection_under_it_and_no_other() {
    let registry = Arc::new(Revocations::default());
    let root = ca();
    let (issuing, intermediate) = intermediate(&root, 3);
    let under = [1, 2].map(|serial| {
        let presented = [leaf(&issuing, serial), intermediate.clone()];
        track_now(&registry, &root, &presented)
    });
    // Issued by the root itself; its serial is the intermediate's, but
    // the list of its issuer does not name it.
    let beside = track_now(&registry, &root, &[leaf(&root, 9)]);
    // The intermediate's own list, naming a leaf of another.
    registry.install(lists(&issuing, 5));
    assert!(
        under
            .iter()
            .all(|tracked| !tracked.revocation().is_revoked())
    );

    registry.install(lists(&root, 3));
    for tracked in &under {
        assert!(tracked.revocation().is_revoked(), "{tracked:?}");
    }
    assert!(!beside.revocation().is_revoked());
}

#[tokio::test]
async fn a_connection_waiting_on_its_revocation_wakes_when_it_is_revoked() {
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    let tracked = track_now(&registry, &ca, &[leaf(&ca, 6)]);
    let revocation = tracked.revocation().clone();
    let waiting = tokio::spawn(async move { revocation.revoked().await });
    tokio::task::yield_now().await;
    registry.install(lists(&ca, 6));
    // Bounded: a wake-up that never comes fails here instead of hanging.
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting connection was not woken by its revocation")
        .unwrap();
}

#[test]
fn a_closed_connection_is_no_longer_tracked() {
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    let first = track_now(&registry, &ca, &[leaf(&ca, 1)]);
    let second = track_now(&registry, &ca, &[leaf(&ca, 2)]);
    assert_eq!(registry.open.len(), 2);
    drop(first);
    assert_eq!(registry.open.len(), 1);
    registry.install(lists(&ca, 2));
    assert!(second.revocation().is_revoked());
    drop(second);
    assert_eq!(registry.open.len(), 0);
}

#[test]
fn a_connection_tracked_after_an_install_it_began_before_is_judged_as_it_is_tracked() {
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    // Both handshakes began before the install: their verifiers may have
    // seen the lists before it, and its re-check ran before they were
    // tracked.
    let began = registry.generation();
    registry.install(lists(&ca, 5));
    let revoked = Revocations::track(
        &registry,
        chain(&[leaf(&ca, 5)], began),
        roots(&ca),
        PeerRole::Client,
    );
    let kept = Revocations::track(
        &registry,
        chain(&[leaf(&ca, 6)], began),
        roots(&ca),
        PeerRole::Client,
    );
    assert!(revoked.revocation().is_revoked());
    assert!(!kept.revocation().is_revoked());
}

/// A connection with no handshake (the proxy's same-node path) is judged
/// at once against the lists in force, where a handshake's verifier would
/// have refused a revoked chain, and then as any other tracked connection;
/// nothing is tracked while tracking is off.
#[test]
fn a_connection_without_a_handshake_is_judged_at_once_and_then_tracked() {
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    let (revoked, kept) = ([leaf(&ca, 3)], [leaf(&ca, 4)]);
    let untracked = Revocations::track_in_process(&registry, &kept, roots(&ca), PeerRole::Client);
    assert!(untracked.is_none(), "tracking is off");

    registry.tracking.store(true, Ordering::SeqCst);
    registry.install(lists(&ca, 3));
    let track = |presented: &[CertificateDer<'static>], role| {
        Revocations::track_in_process(&registry, presented, roots(&ca), role).unwrap()
    };
    assert!(track(&revoked, PeerRole::Client).revocation().is_revoked());
    assert!(track(&revoked, PeerRole::Server).revocation().is_revoked());
    let open = track(&kept, PeerRole::Server);
    assert!(!open.revocation().is_revoked());
    registry.install(lists(&ca, 4));
    assert!(open.revocation().is_revoked(), "a later list revokes it");
}

#[test]
fn no_connection_tracked_while_a_list_is_installed_slips_through() {
    const THREADS: usize = 4;
    const EACH: usize = 100;
    let registry = Arc::new(Revocations::default());
    let ca = ca();
    let presented = [leaf(&ca, 8)];
    let revoking = lists(&ca, 8);
    let start = Barrier::new(THREADS + 1);
    let (tracked, installed_in) = std::thread::scope(|scope| {
        let trackers: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    (0..EACH)
                        .map(|_| {
                            let began = registry.generation();
                            let chain = chain(&presented, began);
                            let tracked =
                                Revocations::track(&registry, chain, roots(&ca), PeerRole::Client);
                            (began, tracked)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        start.wait();
        let installed_in = registry.generation() + 1;
        registry.install(revoking.clone());
        let tracked: Vec<_> = trackers
            .into_iter()
            .flat_map(|tracker| tracker.join().unwrap())
            .collect();
        (tracked, installed_in)
    });
    // A handshake that began once the list was in force was verified
    // against it (and would have been refused); every earlier one is told.
    for (began, tracked) in &tracked {
        assert!(
            *began >= installed_in || tracked.revocation().is_revoked(),
            "began in generation {began}, list installed in {installed_in}"
        );
    }
}
