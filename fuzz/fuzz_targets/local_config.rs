//! Fuzzes the proxy's local config file (`LOCAL_XDS_PATH`, WIRE.md §11):
//! `config::local::parse` on any text, and the state an accepted file
//! becomes (`LocalConfig::into_state`).
//!
//! Properties: no panic; an accepted file has unique workload uids,
//! service keys and policy names, and a valid SPIFFE identity for every
//! workload; its addresses are canonical; in the state every workload is
//! found by its uid and (unless on the host network) by each of its
//! addresses, every service by its key and each of its VIPs, and every
//! policy by its name; parsing is deterministic.

#![no_main]

use std::collections::BTreeSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use ztunnel_proxy::config::local::parse;
use ztunnel_proxy::state::NetworkMode;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("local.yaml");
    let Ok(config) = parse(text, path) else {
        return;
    };
    let again = parse(text, path).expect("the same text parses again");
    assert_eq!(again, config);

    let uids: BTreeSet<_> = config.workloads.iter().map(|w| w.uid.clone()).collect();
    assert_eq!(uids.len(), config.workloads.len());
    let keys: BTreeSet<_> = config.services.iter().map(|s| s.key()).collect();
    assert_eq!(keys.len(), config.services.len());
    for workload in &config.workloads {
        assert_eq!(
            workload.identity.namespace(),
            &*workload.namespace,
            "{}",
            workload.uid
        );
        for ip in &workload.addresses {
            assert_eq!(*ip, ip.to_canonical());
        }
    }

    let state = config.clone().into_state();
    for workload in &config.workloads {
        let stored = state.workload(&workload.uid).expect("stored by uid");
        assert_eq!(**stored, *workload);
        if workload.network_mode == NetworkMode::HostNetwork {
            continue;
        }
        for ip in &workload.addresses {
            // Two workloads may claim one address; the one found owns it.
            let owner = state
                .workload_by_address(&workload.network, *ip)
                .expect("found by its address");
            assert!(owner.addresses.contains(ip) && owner.network == workload.network);
        }
    }
    for service in &config.services {
        assert_eq!(
            **state.service(&service.key()).expect("stored by key"),
            *service
        );
        for vip in &service.vips {
            let owner = state
                .service_by_vip(&vip.network, vip.address)
                .expect("found by its VIP");
            assert!(owner.vips.contains(vip));
        }
    }
    for (name, policy) in &config.policies {
        assert_eq!(**state.policy(name).expect("stored by name"), *policy);
    }
});
