//! Node inspection: the ironic-inspector state machine run by a pool of workers over an at-least-once work queue.
//!
//! - [`machine`]: states, events, the transition table, strict and reentrant events.
//! - [`records`]: node records, queued requests, taken requests.
//! - [`lookup`]: which node a ramdisk's data belongs to (ironic-inspector's scoring).
//! - [`engine`]: the public operations and the worker pool (lock, transition, task, consume).
//! - [`service`]: the `Inspection` gRPC service.
//! - [`periodic`]: singleton tasks: timeout, Ironic synchronisation, Ironic's own inspections, clean-up.
//! - [`processing`]: ironic-inspector's processing hooks; [`rules`]: its introspection rules; [`process`]: the
//!   processing task that runs both and writes the result to Ironic.
//!
//! The inspections' records, data and work queue live in [`crate::store`], with the filter state and the rules.
pub mod engine;
pub mod lookup;
pub mod machine;
pub mod periodic;
pub mod process;
pub mod processing;
pub mod records;
pub mod rules;
pub mod service;

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
