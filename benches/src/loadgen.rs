//! The load generator (placeholder).
