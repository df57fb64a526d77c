//! The store conformance suite: every `coord:sync/store` operation and the
//! guarantee `wit/store.wit` states for it, as functions over a [`Harness`].
//!
//! coord's own backends run it from `tests/all/conformance.rs`. A backend
//! of your own runs it the same way: write an `async fn(history: usize) ->
//! Harness` (see [`Harness::new`]) and expand [`conformance_suite!`] with
//! it in a test module, which makes one `#[tokio::test]` per guarantee.

use crate::Harness;
use coord_host::backend::*;

/// Changes each partition's feed keeps in this suite (small, to test
/// trimming): the `history` a suite's harness must be made with.
pub const HISTORY: usize = 8;

fn conflict(reply: WriteReply) -> Option<Entry> {
    match reply.outcome {
        Outcome::Conflict(current) => current,
        Outcome::Applied(entry) => panic!("expected conflict, got applied {entry:?}"),
    }
}

async fn put(h: &Harness, p: &str, k: &str, v: &str, ttl: Option<u64>, c: Condition) -> WriteReply {
    h.backend.put(p, k, v.as_bytes(), ttl, &c).await.unwrap()
}

pub mod counted;
pub mod meters;
pub mod reads;
pub mod unwatched;
pub mod waits;
pub mod writes;

/// One `#[tokio::test]` per conformance function, each on a fresh harness
/// from `$make` (an `async fn(history: usize) -> Harness`, called with
/// [`HISTORY`]) and under the [`crate::watchdog`] of its store calls.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@each $make;
            writes::now_is_the_stores_clock,
            writes::create_if_absent_is_exclusive_and_conflicts_report_the_holder,
            writes::revisions_strictly_increase_across_every_kind_of_write,
            writes::update_and_delete_are_conditional_on_revision_and_value,
            writes::delete_and_touch_of_an_absent_key_conflict_with_none,
            writes::touch_renews_the_ttl_without_a_revision_or_a_change,
            writes::expired_entries_are_invisible_and_free_their_key,
            writes::expiry_appears_in_the_feed_even_when_nobody_was_reading,
            writes::renewed_and_shortened_ttls_expire_at_their_new_times_in_order,
            writes::every_write_reply_carries_the_partitions_revision,
            reads::list_filters_by_prefix_in_key_order_with_the_revision,
            reads::changes_continue_a_listing_with_no_gap_and_no_repeat,
            reads::changes_report_history_gone_once_trimmed,
            reads::partitions_are_independent,
            waits::wait_returns_at_once_when_already_changed,
            waits::wait_is_woken_by_a_write,
            waits::wait_times_out_on_the_stores_clock,
            waits::wait_is_woken_by_an_expiry,
            waits::wait_then_put_puts_once_the_partition_changes,
            waits::wait_then_put_puts_once_at_its_timeout_whatever_the_outcome,
            waits::wait_then_put_after_a_change_already_made_puts_at_once,
            unwatched::an_unwatched_partition_keeps_every_guarantee_but_the_feed,
            unwatched::unwatched_keys_and_values_of_any_bytes_and_sizes_round_trip_and_never_meet,
            unwatched::a_wait_on_an_unwatched_partition_is_woken_by_writes_and_by_expiry,
            unwatched::a_wait_then_put_on_an_unwatched_partition_puts_once_the_holder_goes,
            counted::absent_and_fewer_than_admits_up_to_the_limit_and_reports_the_first_to_expire,
            counted::absent_and_fewer_than_with_no_place_or_no_expiry_names_what_it_can,
            counted::a_wait_then_put_for_a_place_lands_once_a_place_is_freed,
            meters::meter_answers_as_the_reference_algorithms_on_a_generated_trace,
            meters::meter_state_is_not_an_entry_and_makes_no_changes,
        );
    };
    (@each $make:path; $($module:ident :: $name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make($crate::conformance::HISTORY).await;
                $crate::watched(harness, $crate::conformance::$module::$name).await
            }
        )*
    };
}
