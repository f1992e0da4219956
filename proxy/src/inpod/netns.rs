//! Pod network namespaces and the sockets made inside them. Being written.
