//! Configuration sources. Only the local config file is here for now; the
//! typed environment and flag configuration comes later, and is then the one
//! place that reads the environment.

pub mod local;
