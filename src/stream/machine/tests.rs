//! Table tests over the transitions.

use std::time::Duration;

use super::*;

type S = State<()>;
type O = Outcome<()>;

fn watch(rv: &str, via: Via) -> S {
    State::Watch {
        at: Cursor { rv: rv.into(), via },
        open: None,
    }
}

fn sync(reason: Reason, via: Via) -> S {
    State::Sync { reason, via }
}

fn stopped(why: Stop, at: Option<&str>) -> O {
    Outcome::Stopped {
        why,
        at: at.map(str::to_string),
    }
}

fn api(code: u16, retry_after: Option<u64>) -> Stop {
    Stop::Api(ApiError::Status {
        code,
        reason: "R".into(),
        message: "m".into(),
        retry_after: retry_after.map(Duration::from_secs),
    })
}

/// The state after a backoff, or the state itself; and whether it was reached through one.
fn settle(s: S) -> (S, bool) {
    match s {
        State::Backoff { then, .. } => (*then, true),
        s => (s, false),
    }
}

#[test]
fn transitions() {
    use Reason::*;
    use Via::*;
    // (state, outcome, next state, through a backoff, restart reason)
    let table: Vec<(S, O, S, bool, Option<&str>)> = vec![
        // Starting points.
        (
            State::AwaitResource { via: InitialEvents },
            Outcome::Served { checkpoint: None },
            sync(Start, InitialEvents),
            false,
            None,
        ),
        (
            State::AwaitResource { via: Pages },
            Outcome::Served {
                checkpoint: Some("7".into()),
            },
            watch("7", Pages),
            false,
            None,
        ),
        (
            State::AwaitResource { via: Pages },
            stopped(Stop::NotServed, None),
            State::AwaitResource { via: Pages },
            true,
            None,
        ),
        // A sync ends in a watch from its resourceVersion.
        (
            sync(Start, Pages),
            Outcome::Synced {
                rv: "10".into(),
                open: None,
            },
            watch("10", Pages),
            false,
            None,
        ),
        (
            sync(Resync, InitialEvents),
            Outcome::Synced {
                rv: "10".into(),
                open: Some(()),
            },
            State::Watch {
                at: Cursor {
                    rv: "10".into(),
                    via: InitialEvents,
                },
                open: Some(()),
            },
            false,
            None,
        ),
        // A server without WatchList: lists from then on, at once.
        (
            sync(Resync, InitialEvents),
            stopped(Stop::Refused, None),
            sync(Resync, Pages),
            false,
            None,
        ),
        // An interrupted sync starts over, after a backoff (a server closing every sync is
        // not hammered).
        (
            sync(Start, InitialEvents),
            stopped(Stop::Closed, None),
            sync(Start, InitialEvents),
            true,
            Some("sync_interrupted"),
        ),
        (
            sync(Start, Pages),
            stopped(api(500, None), None),
            sync(Start, Pages),
            true,
            None,
        ),
        // A watch resumes from the last position it read.
        (
            watch("10", Pages),
            stopped(Stop::Closed, Some("15")),
            watch("15", Pages),
            false,
            None,
        ),
        // Closed having read nothing past its start: after a backoff.
        (
            watch("10", Pages),
            stopped(Stop::Closed, None),
            watch("10", Pages),
            true,
            None,
        ),
        (
            watch("10", Pages),
            stopped(Stop::Closed, Some("10")),
            watch("10", Pages),
            true,
            None,
        ),
        (
            watch("10", InitialEvents),
            stopped(Stop::Api(ApiError::Body("cut".into())), Some("12")),
            watch("12", InitialEvents),
            true,
            Some("connection"),
        ),
        (
            watch("10", Pages),
            stopped(api(429, Some(3)), None),
            watch("10", Pages),
            true,
            None,
        ),
        // 410: resync, keeping the way the stream syncs.
        (
            watch("10", InitialEvents),
            stopped(Stop::Gone, Some("11")),
            sync(Resync, InitialEvents),
            false,
            Some("expired"),
        ),
        (
            sync(Start, Pages),
            stopped(Stop::Gone, None),
            sync(Resync, Pages),
            false,
            Some("expired"),
        ),
        // A rewound history (an etcd restore): resync too, counted apart.
        (
            watch("10", InitialEvents),
            stopped(Stop::Rewound, None),
            sync(Resync, InitialEvents),
            false,
            Some("rewound"),
        ),
        // Behind the position (504 "Too large resource version"): a lagging watch cache or a
        // rewind; a resync after a backoff tells them apart. A sync keeps its reason.
        (
            watch("10", InitialEvents),
            stopped(Stop::Behind, None),
            sync(Resync, InitialEvents),
            true,
            Some("behind"),
        ),
        (
            sync(Start, Pages),
            stopped(Stop::Behind, None),
            sync(Start, Pages),
            true,
            Some("behind"),
        ),
        // A stalled watch is reopened from where it was, at once, and counted.
        (
            watch("10", Pages),
            stopped(Stop::Stalled, Some("11")),
            watch("11", Pages),
            false,
            Some("stalled"),
        ),
        // A requested resync relists and reconciles.
        (
            watch("10", InitialEvents),
            stopped(Stop::Requested, Some("12")),
            sync(Resync, InitialEvents),
            false,
            Some("requested"),
        ),
        // A failed delivery replays from the checkpoint.
        (
            watch("10", Pages),
            stopped(
                Stop::Delivery {
                    failure: Failure::BatchTooLarge,
                    checkpoint: Some("8".into()),
                },
                Some("12"),
            ),
            watch("8", Pages),
            true,
            Some("delivery_failed"),
        ),
        (
            sync(Resync, InitialEvents),
            stopped(
                Stop::Delivery {
                    failure: Failure::BatchTooLarge,
                    checkpoint: None,
                },
                None,
            ),
            sync(Start, InitialEvents),
            true,
            Some("delivery_failed"),
        ),
        // A custom resource that went away is awaited again.
        (
            watch("10", Pages),
            stopped(Stop::NotServed, None),
            State::AwaitResource { via: Pages },
            true,
            None,
        ),
        // Backoff, cancellation.
        (
            State::Backoff {
                then: Box::new(watch("3", Pages)),
                delay: Duration::from_millis(1),
            },
            Outcome::Waited,
            watch("3", Pages),
            false,
            None,
        ),
        (
            State::Backoff {
                then: Box::new(watch("3", Pages)),
                delay: Duration::from_millis(1),
            },
            stopped(Stop::Cancelled, None),
            State::Done,
            false,
            None,
        ),
        (
            watch("3", Pages),
            stopped(Stop::Cancelled, Some("4")),
            State::Done,
            false,
            None,
        ),
    ];
    for (i, (state, outcome, want, through_backoff, restart)) in table.into_iter().enumerate() {
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 7);
        let row = format!("row {i}: {state:?} + {outcome:?}");
        let t = next(state, outcome, &mut backoff, Profile::default());
        assert_eq!(t.restart, restart, "{row}");
        let (got, backed_off) = settle(t.next);
        assert_eq!(got, want, "{row}");
        assert_eq!(backed_off, through_backoff, "{row}");
    }
}

#[test]
fn retry_after_sets_the_delay_and_successes_reset_the_backoff() {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10), 1);
    let t = next(
        watch("1", Via::Pages),
        stopped(api(429, Some(3)), None),
        &mut backoff,
        Profile::default(),
    );
    assert!(matches!(t.next, State::Backoff { delay, .. } if delay == Duration::from_secs(3)));
    for _ in 0..5 {
        backoff.next();
    }
    next(
        sync(Reason::Start, Via::Pages),
        Outcome::Synced {
            rv: "2".into(),
            open: None,
        },
        &mut backoff,
        Profile::default(),
    );
    assert!(backoff.next() <= Duration::from_millis(100));
}

#[test]
fn streams_start_where_their_checkpoint_is() {
    assert_eq!(
        start::<()>(true, None, Via::InitialEvents),
        sync(Reason::Start, Via::InitialEvents)
    );
    assert_eq!(
        start::<()>(true, Some("5".into()), Via::Pages),
        watch("5", Via::Pages)
    );
    assert_eq!(
        start::<()>(false, Some("5".into()), Via::Pages),
        State::AwaitResource { via: Via::Pages }
    );
}

#[test]
fn backoff_grows_with_jitter_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800), 42);
    let d: Vec<_> = (0..6).map(|_| b.next()).collect();
    for (i, d) in d.iter().enumerate() {
        let base = Duration::from_millis(100 << i.min(3));
        assert!(*d >= base / 2 && *d <= base, "{i}: {d:?}");
    }
    b.reset();
    assert!(b.next() <= Duration::from_millis(100));
}

#[test]
fn an_unsettled_filtered_stream_resyncs_whole_after_a_failed_delivery_and_a_rewind_asks_for_a_full_one(
) {
    let failed = |checkpoint: Option<&str>| {
        stopped(
            Stop::Delivery {
                failure: Failure::BatchTooLarge,
                checkpoint: checkpoint.map(str::to_string),
            },
            None,
        )
    };
    let filtered = Profile { unsettled: true };
    // (profile, state, outcome, next state once waited, a full resync)
    let table: Vec<(Profile, S, O, S, bool)> = vec![
        (
            filtered,
            watch("10", Via::Pages),
            failed(Some("8")),
            sync(Reason::Resync, Via::Pages),
            true,
        ),
        (
            filtered,
            watch("10", Via::Pages),
            failed(None),
            sync(Reason::Start, Via::Pages),
            true,
        ),
        (
            Profile::default(),
            watch("10", Via::Pages),
            failed(Some("8")),
            watch("8", Via::Pages),
            false,
        ),
        (
            Profile::default(),
            watch("10", Via::InitialEvents),
            stopped(Stop::Rewound, None),
            sync(Reason::Resync, Via::InitialEvents),
            true,
        ),
        (
            Profile::default(),
            watch("10", Via::InitialEvents),
            stopped(Stop::Gone, None),
            sync(Reason::Resync, Via::InitialEvents),
            false,
        ),
        // Behind the position (504): a delta resync, not a full one; the list decides.
        (
            Profile::default(),
            watch("10", Via::InitialEvents),
            stopped(Stop::Behind, None),
            sync(Reason::Resync, Via::InitialEvents),
            false,
        ),
        (
            filtered,
            watch("10", Via::Pages),
            stopped(Stop::Behind, None),
            sync(Reason::Resync, Via::Pages),
            false,
        ),
    ];
    for (i, (profile, state, outcome, want, full)) in table.into_iter().enumerate() {
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 7);
        let t = next(state, outcome, &mut backoff, profile);
        assert_eq!((settle(t.next).0, t.full), (want, full), "row {i}");
    }
}

#[test]
fn a_sync_with_members_reconciles_like_a_resync() {
    use Reason::*;
    let cases = [
        (Start, false, Start),
        (Start, true, Resync),
        (Resync, false, Resync),
        (Resync, true, Resync),
    ];
    for (reason, has_members, want) in cases {
        assert_eq!(
            sync_reason(reason, has_members),
            want,
            "{reason:?} {has_members}"
        );
    }
}

#[test]
fn api_errors_are_classified_into_stops() {
    let status = |code: u16, message: &str| ApiError::Status {
        code,
        reason: "R".into(),
        message: message.into(),
        retry_after: None,
    };
    let gone = || ApiError::Gone("expired".into());
    // (error, built-in resource, the stop's name)
    let cases = [
        (gone(), true, "Gone"),
        (
            status(504, "Too large resource version: 99"),
            true,
            "Behind",
        ),
        (status(504, "Timeout"), true, "Api"),
        (status(404, "not found"), false, "NotServed"),
        (status(404, "not found"), true, "Api"),
        (status(403, "forbidden"), true, "Api"),
    ];
    for (e, builtin, want) in cases {
        let got = format!("{:?}", api_stop(e, builtin));
        assert!(got.starts_with(want), "{got} is not {want}");
    }
    assert!(matches!(
        page_failed(gone(), true, true),
        PageFailure::Refetch
    ));
    assert!(matches!(
        page_failed(gone(), false, true),
        PageFailure::Stop(Stop::Gone)
    ));
}
