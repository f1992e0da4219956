//! Benchmark support: load generator and harness (issue 5). Micro-benches live in `benches/`.
