//! The live heap in pprof's protobuf format (`/debug/pprof/heap`), from the
//! allocation sampler's table (`sampler.rs`): per call stack, the objects
//! and bytes in use, each sample scaled up by the inverse of its chance of
//! being sampled, as Go's runtime reports its heap, so that `go tool pprof`
//! reads it as it reads a Go program's (`inuse_space`, `inuse_objects`).
//!
//! Pure: the stacks' symbols come from the caller's `symbolize`, so the
//! grouping, the scaling and the encoding are tested on plain data.

use std::collections::HashMap;

use pprof::protos::{Function, Line, Location, Profile, Sample, ValueType};

use super::sampler;

/// One frame of a symbolized address: an address inlined into its caller
/// symbolizes to several, innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The function, demangled.
    pub name: String,
    /// Its source file, when known.
    pub file: String,
    /// The line, 0 when unknown.
    pub line: u32,
}

/// Marks of the functions between an allocation's caller and the sampler
/// (the sampler itself, the unwinder it calls, the allocator's entry
/// points): a stack is cut through the last of its innermost addresses to
/// show one. Inlined frames carry short names, so an address is known by
/// any of its frames.
const ALLOCATOR_MARKS: [&str; 6] = [
    "memory::sampler::",
    "backtrace::",
    "__rust_alloc",
    "__rust_realloc",
    "__rg_",
    "__rdl_",
];

/// How deep into a stack the allocator's frames are looked for.
const ALLOCATOR_DEPTH: usize = 12;

/// The profile of `samples`, taken about one per `sample_bytes` bytes
/// allocated, each address's frames from `symbolize`.
pub fn build(
    samples: &[sampler::Sample],
    sample_bytes: u64,
    mut symbolize: impl FnMut(usize) -> Vec<Frame>,
) -> Profile {
    let mut strings = Strings::default();
    let mut profile = Profile {
        sample_type: vec![
            value_type(&mut strings, "inuse_objects", "count"),
            value_type(&mut strings, "inuse_space", "bytes"),
        ],
        period_type: Some(value_type(&mut strings, "space", "bytes")),
        period: i64::try_from(sample_bytes).unwrap_or(i64::MAX),
        ..Profile::default()
    };
    let mut frames_of: HashMap<usize, Vec<Frame>> = HashMap::new();
    let mut totals: HashMap<Vec<usize>, (f64, f64)> = HashMap::new();
    for sample in samples {
        let cut = sample
            .frames
            .iter()
            .take(ALLOCATOR_DEPTH)
            .rposition(|address| {
                let frames = frames_of
                    .entry(*address)
                    .or_insert_with(|| symbolize(*address));
                is_allocator(frames)
            })
            .map_or(0, |last| last + 1);
        let stack = sample.frames[cut..].to_vec();
        let (objects, bytes) = unsampled(sample.size, sample_bytes);
        let total = totals.entry(stack).or_insert((0.0, 0.0));
        total.0 += objects;
        total.1 += bytes;
    }
    let mut locations: HashMap<usize, u64> = HashMap::new();
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut stacks: Vec<(Vec<usize>, (f64, f64))> = totals.into_iter().collect();
    // Largest first, as pprof lists them; stable across calls.
    stacks.sort_by(|a, b| b.1.1.total_cmp(&a.1.1).then_with(|| a.0.cmp(&b.0)));
    for (stack, (objects, bytes)) in stacks {
        let mut location_id = Vec::with_capacity(stack.len());
        for address in stack {
            let next = locations.len() as u64 + 1;
            let id = *locations.entry(address).or_insert(next);
            if id == next {
                let frames = frames_of
                    .entry(address)
                    .or_insert_with(|| symbolize(address));
                let line = frames
                    .iter()
                    .map(|frame| Line {
                        function_id: function_id(
                            &mut functions,
                            &mut profile.function,
                            &mut strings,
                            frame,
                        ),
                        line: i64::from(frame.line),
                    })
                    .collect();
                profile.location.push(Location {
                    id,
                    address: address as u64,
                    line,
                    ..Location::default()
                });
            }
            location_id.push(id);
        }
        profile.sample.push(Sample {
            location_id,
            value: vec![objects.round() as i64, bytes.round() as i64],
            ..Sample::default()
        });
    }
    profile.string_table = strings.table;
    profile
}

/// The objects and bytes one sample of `size` bytes stands for: divided
/// by its chance of being sampled, `1 - e^(-size/sample_bytes)`.
pub fn unsampled(size: usize, sample_bytes: u64) -> (f64, f64) {
    let size = size as f64;
    if sample_bytes == 0 || size == 0.0 {
        return (1.0, size);
    }
    let chance = 1.0 - (-size / sample_bytes as f64).exp();
    (1.0 / chance, size / chance)
}

/// Whether an address is the allocator's or the sampler's.
fn is_allocator(frames: &[Frame]) -> bool {
    frames
        .iter()
        .any(|frame| ALLOCATOR_MARKS.iter().any(|mark| frame.name.contains(mark)))
}

fn function_id(
    functions: &mut HashMap<(String, String), u64>,
    table: &mut Vec<Function>,
    strings: &mut Strings,
    frame: &Frame,
) -> u64 {
    let key = (frame.name.clone(), frame.file.clone());
    if let Some(id) = functions.get(&key) {
        return *id;
    }
    let id = table.len() as u64 + 1;
    let name = strings.index(&frame.name);
    table.push(Function {
        id,
        name,
        system_name: name,
        filename: strings.index(&frame.file),
        ..Function::default()
    });
    functions.insert(key, id);
    id
}

fn value_type(strings: &mut Strings, ty: &str, unit: &str) -> ValueType {
    ValueType {
        ty: strings.index(ty),
        unit: strings.index(unit),
    }
}

/// pprof's string table: every string once, `""` first.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Self {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }
}

impl Strings {
    fn index(&mut self, text: &str) -> i64 {
        if let Some(index) = self.index.get(text) {
            return *index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

/// The frames of the return address `address` in this process, from its
/// debug information: the call's own line, one byte before where it
/// returns to.
pub fn symbolize(address: usize) -> Vec<Frame> {
    let mut frames = Vec::new();
    let call = address.saturating_sub(1);
    backtrace::resolve(call as *mut std::ffi::c_void, |symbol| {
        frames.push(Frame {
            name: symbol
                .name()
                .map_or_else(|| format!("{address:#x}"), |name| format!("{name:#}")),
            file: symbol
                .filename()
                .map(|file| file.display().to_string())
                .unwrap_or_default(),
            line: symbol.lineno().unwrap_or(0),
        });
    });
    if frames.is_empty() {
        frames.push(Frame {
            name: format!("{address:#x}"),
            file: String::new(),
            line: 0,
        });
    }
    frames
}

#[cfg(test)]
mod tests;
