//! Placeholder until the micro-bench lands.
fn main() {}
