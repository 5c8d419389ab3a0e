//! The conformance cases, grouped by capability. [`crate::for_each_case!`] lists every case once;
//! a case missing from that list is not run, so the list and the modules must stay in step.

pub mod chunking;
pub mod feed;
pub mod reads;
pub mod registry;
pub mod search;
pub mod tree;
pub mod writes;

/// Calls `$callback!($factory; module::case, …)` with every conformance case.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_case {
    ($callback:path, $factory:expr) => {
        $callback!($factory;
            registry::sessions_are_created_patched_and_deleted,
            registry::appending_creates_a_session_with_an_empty_record,
            registry::listings_page_both_ways_with_cursors,
            registry::message_lists_page_over_the_active_path,
            registry::compaction_overlays_apply_on_path_reads_only,
            registry::stored_echoes_of_own_summaries_are_hidden,
            registry::state_is_json_per_session,
            registry::namespace_search_spans_sessions_but_not_namespaces,
            registry::resumed_subscriptions_replay_retained_events,
            registry::export_reimports_into_an_equal_session,
            tree::appends_chain_in_order,
            tree::reappend_keeps_first_content,
            tree::explicit_parent_starts_a_branch,
            tree::root_parent_starts_a_new_tree,
            tree::unknown_or_empty_parent_makes_a_root,
            tree::parent_from_another_session_makes_a_root,
            tree::generated_ids_are_unique_and_prefixed,
            tree::compaction_ids_are_never_stored,
            tree::append_result_matches_later_reads,
            tree::created_at_is_stamped_by_the_store,
            tree::same_id_in_two_sessions_is_independent,
            tree::namespaces_never_see_each_other,
            tree::invalid_session_ids_are_refused,
            tree::branch_append_becomes_the_active_leaf,
            tree::append_all_chains_atomically,
            tree::seq_strictly_increases_and_is_never_reused,
            tree::concurrent_appends_all_land,
            writes::update_replaces_body_and_keeps_position,
            writes::message_quota_refuses_the_whole_request,
            writes::update_of_unknown_id_creates_nothing,
            writes::identical_update_writes_and_emits_nothing,
            writes::update_needs_an_id,
            writes::update_can_change_the_role,
            writes::upsert_appends_when_missing_and_updates_when_present,
            writes::import_is_verbatim_with_explicit_parent_and_time,
            writes::import_of_existing_id_is_ignored,
            writes::import_under_a_missing_parent_keeps_the_link,
            writes::import_that_would_loop_is_refused,
            writes::appends_can_never_close_a_loop_through_orphans,
            writes::delete_splices_children_onto_the_survivor,
            writes::bulk_delete_rewires_the_boundary_child,
            writes::deleting_the_leaf_moves_it_to_the_newest_survivor,
            writes::delete_of_unknown_or_repeated_ids_counts_what_existed,
            writes::clear_empties_the_session_and_keeps_it_usable,
            writes::reserved_metadata_is_stripped_only_from_client_writes,
            writes::provider_metadata_is_sanitised_on_append,
            writes::stats_track_every_kind_of_write,
            writes::custom_token_counter_is_stamped,
            reads::empty_and_unknown_reads_are_empty,
            reads::newest_first_is_the_exact_reverse,
            reads::newest_first_stops_when_the_consumer_does,
            reads::windows_of_fifty_lose_nothing,
            reads::history_batches_by_count_and_bytes,
            reads::recent_history_is_the_longest_fitting_suffix,
            reads::row_stats_describe_rows_without_content,
            reads::path_length_follows_the_chosen_leaf,
            reads::branches_list_children_oldest_first,
            reads::paths_are_capped_at_ten_thousand_and_one_rows,
            reads::imported_rows_move_the_leaf_even_off_branch,
            chunking::two_mib_message_round_trips,
            chunking::five_million_chars_and_tool_output_round_trip,
            chunking::multibyte_text_over_the_budget_round_trips,
            chunking::shrinking_updates_drop_surplus_slices,
            chunking::unchanged_large_update_is_detected_on_the_whole_body,
            chunking::deleting_a_chunked_message_keeps_the_others,
            chunking::import_of_an_oversized_message_round_trips,
            chunking::recent_history_budgets_whole_chunked_rows,
            search::search_finds_earlier_messages_with_stemming,
            search::query_syntax_is_always_plain_words,
            search::search_never_leaves_its_session,
            search::search_ranks_and_limits,
            search::search_indexes_text_parts_and_string_content_only,
            search::index_follows_updates_deletes_and_clears,
            feed::feed_reports_each_write_in_order,
            feed::feed_carries_parents_and_imports,
            feed::feed_filters_by_session_and_namespace,
            feed::a_stalled_subscriber_never_blocks_writes,
            feed::failed_writes_publish_nothing,
            feed::one_bad_write_does_not_fail_concurrent_ones,
            feed::events_arrive_after_the_write_is_readable,
        );
    };
}
