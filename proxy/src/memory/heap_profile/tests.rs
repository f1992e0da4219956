//! The profile's grouping, scaling and encoding, on made-up stacks.

use super::*;

fn frame(name: &str, line: u32) -> Frame {
    Frame {
        name: name.to_owned(),
        file: "src/x.rs".to_owned(),
        line,
    }
}

/// Addresses 1 and 2 are the sampler's and the allocator's (1 with an
/// inlined frame of a short name); 3 is the standard library's way in, the
/// caller's side; 10 and 11 the caller's, 11 with an inlined frame; 20
/// another caller.
fn symbols(address: usize) -> Vec<Frame> {
    match address {
        1 => vec![
            frame("trace", 117),
            frame("ztunnel_proxy::memory::sampler::record", 1),
        ],
        2 => vec![frame("__rustc::__rust_alloc", 0)],
        3 => vec![frame("alloc::alloc::alloc", 95), frame("allocate", 429)],
        10 => vec![frame("ztunnel_proxy::state::Workload::new", 10)],
        11 => vec![
            frame("alloc::vec::Vec<T>::push", 5),
            frame("ztunnel_proxy::xds::apply", 11),
        ],
        20 => vec![frame("ztunnel_proxy::pool::Pool::checkout", 20)],
        _ => Vec::new(),
    }
}

fn strings(profile: &Profile, ids: &[i64]) -> Vec<String> {
    ids.iter()
        .map(|id| profile.string_table[*id as usize].clone())
        .collect()
}

#[test]
fn unsampling_scales_by_the_chance_of_being_sampled() {
    let rows: &[(usize, u64, f64, f64)] = &[
        // Far above the rate: almost surely sampled, counted once.
        (64 * 1024 * 1024, 512 * 1024, 1.0, 64.0 * 1024.0 * 1024.0),
        // At the rate: sampled with chance 1 - 1/e.
        (512 * 1024, 512 * 1024, 1.582, 829_418.0),
        // Small: stands for many of its kind.
        (64, 512 * 1024, 8192.5, 524_320.0),
        // Sampling off: as it is.
        (100, 0, 1.0, 100.0),
    ];
    for (size, rate, objects, bytes) in rows {
        let (got_objects, got_bytes) = unsampled(*size, *rate);
        assert!(
            (got_objects - objects).abs() / objects < 0.001,
            "{size} at {rate}: {got_objects} objects"
        );
        assert!(
            (got_bytes - bytes).abs() / bytes < 0.001,
            "{size} at {rate}: {got_bytes} bytes"
        );
    }
}

#[test]
fn stacks_are_grouped_without_the_allocators_frames_largest_first() {
    let rate = 512 * 1024;
    let samples = [
        sampler::Sample {
            size: 1024 * 1024,
            frames: vec![1, 2, 3, 20],
        },
        sampler::Sample {
            size: 100,
            frames: vec![1, 2, 11, 10],
        },
        sampler::Sample {
            size: 100,
            frames: vec![1, 2, 11, 10],
        },
    ];
    let profile = build(&samples, rate, symbols);
    assert_eq!(strings(&profile, &[0]), [""], "the empty string first");
    let types: Vec<(i64, i64)> = profile
        .sample_type
        .iter()
        .map(|value| (value.ty, value.unit))
        .collect();
    assert_eq!(
        types
            .iter()
            .map(|(ty, unit)| strings(&profile, &[*ty, *unit]))
            .collect::<Vec<_>>(),
        [["inuse_objects", "count"], ["inuse_space", "bytes"]]
    );
    assert_eq!(profile.period, 512 * 1024);

    assert_eq!(profile.sample.len(), 2, "two stacks");
    let (objects, bytes) = unsampled(1024 * 1024, rate);
    let big = &profile.sample[0];
    assert_eq!(big.value, [objects.round() as i64, bytes.round() as i64]);
    let (objects, bytes) = unsampled(100, rate);
    let small = &profile.sample[1];
    assert_eq!(
        small.value,
        [(2.0 * objects).round() as i64, (2.0 * bytes).round() as i64],
        "the two samples of one stack add up"
    );

    // Leaf first, the allocator's frames cut; an inlined address is one
    // location with both lines, the inlined one first.
    let location = |id: u64| {
        profile
            .location
            .iter()
            .find(|location| location.id == id)
            .unwrap()
    };
    let function = |id: u64| {
        let function = profile
            .function
            .iter()
            .find(|function| function.id == id)
            .unwrap();
        profile.string_table[function.name as usize].clone()
    };
    let addresses: Vec<u64> = small
        .location_id
        .iter()
        .map(|id| location(*id).address)
        .collect();
    assert_eq!(addresses, [11, 10]);
    let inlined: Vec<(String, i64)> = location(small.location_id[0])
        .line
        .iter()
        .map(|line| (function(line.function_id), line.line))
        .collect();
    assert_eq!(
        inlined,
        [
            ("alloc::vec::Vec<T>::push".to_owned(), 5),
            ("ztunnel_proxy::xds::apply".to_owned(), 11)
        ]
    );
    let big_addresses: Vec<u64> = big
        .location_id
        .iter()
        .map(|id| location(*id).address)
        .collect();
    assert_eq!(big_addresses, [3, 20], "the standard library's frames stay");
    assert_eq!(
        profile.location.len(),
        4,
        "one location per address kept: 3, 20, 11, 10"
    );
}

#[test]
fn the_profile_encodes_and_decodes_as_pprofs_message() {
    use pprof::protos::Message;

    let samples = [sampler::Sample {
        size: 4096,
        frames: vec![2, 20],
    }];
    let profile = build(&samples, 512 * 1024, symbols);
    let decoded = Profile::decode(profile.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, profile);
}
