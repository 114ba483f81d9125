//! The parsers the fuzz targets (`fuzz/`, `cargo xtask fuzz`) reach that live in private
//! modules, re-exported unchanged. Not an API: it exists so the targets call exactly the
//! code the agent runs, without widening the crate's public surface elsewhere.

pub use crate::sources::rdma::{
    parse::{parse_counter, parse_counter_bytes, parse_link_layer, parse_state, PortState, ValueError},
    spec::{spec, Group, Spec},
};
