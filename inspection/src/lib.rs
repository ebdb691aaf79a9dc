//! `ironguard-inspection` — the inspection domain of ironic-inspector, pure: no I/O, no store, no network, no
//! async runtime. The control plane's engine drives it (work queue, workers, Ironic, the gRPC and REST APIs).
//!
//! - [`machine`]: states, events, the transition table, strict and reentrant events.
//! - [`records`]: what is stored about an inspection: the node record, queued and taken requests.
//! - [`bounded`]: the ramdisk's data parsed within bounds (values, nesting), without its logs.
//! - [`lookup`]: which node a ramdisk's data belongs to (its lookup attributes, ironic-inspector's scoring).
//! - [`processing`]: ironic-inspector's processing hooks as a pipeline that turns the ramdisk's data and the node
//!   as Ironic has it into a [`processing::Plan`] of Ironic writes.
//! - [`rules`]: introspection rules: validation of what users post, evaluation into [`rules::Effect`]s.
//! - [`outcome`]: the rules' effects folded into the hooks' plan.
//!
//! [`clip`] cuts caller input quoted in error messages.
#![forbid(unsafe_code)]

pub mod bounded;
pub mod lookup;
pub mod machine;
pub mod outcome;
pub mod processing;
pub mod records;
pub mod rules;

/// At most `max` characters of caller input quoted in an error message, with `…` when cut: a gRPC message travels
/// in a header, and an echo of a 20 kB argument would break it (the caller would see INTERNAL, not the error).
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn clip_cuts_at_a_character_boundary() {
        assert_eq!(super::clip("abc", 2), "ab…");
        assert_eq!(super::clip("abc", 3), "abc");
        assert_eq!(super::clip("ééé", 2), "éé…");
        assert_eq!(super::clip("", 0), "");
    }
}
