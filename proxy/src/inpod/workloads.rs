//! The per-pod proxies of the shared mode. Being written.
