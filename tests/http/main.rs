//! The HTTP layer's promises: the cache key (what a handler sees differently
//! never shares an entry), RFC 9111 and 9110 semantics, unsafe methods,
//! bodies and ranges, and the headers an answer carries (`Cache-Status`,
//! `x-cache`, tags). Most run on the embedded backend; a few on real Redis.

#[path = "../common/mod.rs"]
mod common;

/// Counts the live heap for the tests that measure memory (`memory`,
/// `streams`); they run alone in a child process.
#[global_allocator]
static ALLOCATOR: common::counting::Counting = common::counting::Counting;

mod attack_classes;
mod attacks_on_sharing;
mod bodies;
mod bodies_over_the_cap;
mod builder_limits;
mod cache_status;
mod client_forced_passes;
mod date_edges;
mod dates;
mod expired_revalidation;
mod explicit_freshness;
mod headers_on_pass_through;
mod headers_per_state;
mod hit_path_scan;
mod key_encoding;
mod key_poisoning;
mod keys;
mod learned_vary;
mod memory;
mod negotiation_and_preconditions;
mod numbers;
mod one_client_answers;
mod over_cap_readers;
mod range_edges;
mod ranges;
mod request_directives;
mod revalidation;
mod review_attacks;
mod rfc;
mod rfc_edges;
mod rfc_waiters;
mod route_config;
mod safety;
mod semantics;
mod stored_status;
mod streams;
mod tag_and_status_headers;
mod unreadable_inputs;
mod unsafe_method_targets;
mod unsafe_methods;
