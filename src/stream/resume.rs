//! Where a stream resumes: decided once, at its start, from what its checkpoint saved and what
//! the configuration asks for now. Pure, table-tested; the driver acts on the [`Plan`].
//!
//! | saved query | saved route | plan |
//! |---|---|---|
//! | none or this one | none or this one | resume from the position |
//! | another one (not filtered) | this one | drop the position, reconcile with the new query |
//! | any | another one | drop the position, retract what was announced on the old route, stamp the new one after, reconcile |
//!
//! A filtered stream's query includes its namespaces, known only once it runs: its driver
//! compares the queries then.

/// What a stream does with its checkpoint before it reads.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The saved position is dropped: it belongs to another query or route.
    pub drop_position: bool,
    /// The query changed: the position is forgotten in the ConfigMap before anything is
    /// published, and the stream reconciles its members with the new query's state.
    pub query_changed: bool,
    /// The saved query differs from this one (not decided here for a filtered stream).
    pub query_moved: bool,
    /// The route stamped on checkpoints for now: the saved one until what was announced there
    /// is retracted.
    pub route_id: String,
    /// The route to stamp once the retraction is acknowledged: a crash midway leaves the old
    /// route stamped, so the next start retracts the rest.
    pub new_route: Option<String>,
}

/// The query a saved position stands under, for a stream that now reads `query`: the one
/// `saved`, or `query` itself when the position is still to take in what it does not cover
/// (`taking_in`, its query then marked: see [`crate::checkpoint::taking_in`]). A relay that
/// knows no such mark takes it for another query's position, and drops it.
pub fn standing(saved: Option<&str>, taking_in: bool, query: &str) -> Option<String> {
    match saved {
        Some(q) if taking_in && q == crate::checkpoint::taking_in(query) => Some(query.into()),
        saved => saved.map(str::to_string),
    }
}

/// The plan of a stream that now reads `query` and publishes on `route`, whose checkpoint saved
/// `saved_query` and `saved_route`; `filtered` for a cluster-wide stream filtered to
/// namespaces.
pub fn plan(
    saved_query: Option<&str>,
    saved_route: Option<&str>,
    query: &str,
    route: &str,
    filtered: bool,
) -> Plan {
    let query_moved = !filtered && saved_query.is_some_and(|q| q != query);
    let route_moved = saved_route.is_some_and(|r| r != route);
    Plan {
        drop_position: query_moved || route_moved,
        query_changed: query_moved || route_moved,
        query_moved,
        route_id: match saved_route {
            Some(old) if route_moved => old.to_string(),
            _ => route.to_string(),
        },
        new_route: route_moved.then(|| route.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_still_taking_in_stands_under_its_query_only_for_who_knows_the_mark() {
        let marked = crate::checkpoint::taking_in("q");
        assert_eq!(standing(Some(&marked), true, "q").as_deref(), Some("q"));
        assert_eq!(standing(Some("q"), false, "q").as_deref(), Some("q"));
        // Another query's mark, or a mark without the namespaces it covers: not this query's.
        let other = crate::checkpoint::taking_in("old");
        assert_eq!(standing(Some(&other), true, "q"), Some(other.clone()));
        assert_eq!(standing(Some(&marked), false, "q"), Some(marked.clone()));
        // A relay unaware of the mark compares it as it is: another query's, dropped.
        assert!(plan(Some(&marked), None, "q", "r", false).drop_position);
    }

    #[test]
    fn a_position_is_resumed_only_under_its_own_query_and_route() {
        // (saved query, saved route, filtered, drop, moved query, stamped now, stamped after)
        type Row = (
            Option<&'static str>,
            Option<&'static str>,
            bool,
            bool,
            bool,
            &'static str,
            Option<&'static str>,
        );
        let table: [Row; 7] = [
            (None, None, false, false, false, "r", None),
            (Some("q"), Some("r"), false, false, false, "r", None),
            (Some("old"), Some("r"), false, true, true, "r", None),
            (Some("old"), Some("r"), true, false, false, "r", None),
            (Some("q"), Some("old"), false, true, false, "old", Some("r")),
            (
                Some("old"),
                Some("old"),
                false,
                true,
                true,
                "old",
                Some("r"),
            ),
            (Some("q"), None, false, false, false, "r", None),
        ];
        for (i, (sq, sr, filtered, drop, moved, now, after)) in table.into_iter().enumerate() {
            let p = plan(sq, sr, "q", "r", filtered);
            assert_eq!(
                (p.drop_position, p.query_changed, p.query_moved),
                (drop, drop, moved),
                "row {i}"
            );
            assert_eq!(
                (p.route_id.as_str(), p.new_route.as_deref()),
                (now, after),
                "row {i}"
            );
        }
    }
}
