//! The ZDS session with the node agent (WIRE.md §5). Being written.
