//! The end-to-end harness (placeholder).
