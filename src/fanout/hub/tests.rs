//! The hub's decisions, as tables of inputs and the effects they must have, on a clock of their
//! own (every input says when it happened).

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::fanout::board::HELD_BYTES;

const QUIET: Duration = Duration::from_millis(500);
const IDLE: Duration = Duration::from_secs(60);
const START_MAX: Duration = Duration::from_secs(30);
const SLOW_LIST: Duration = Duration::from_secs(30);

fn timing() -> Timing {
    Timing {
        join_quiet: QUIET,
        resume_quiet: QUIET,
        join_max: Duration::from_secs(5),
        start_max: START_MAX,
        retry: Duration::from_secs(1),
        retry_max: Duration::from_secs(30),
        idle: IDLE,
        slow_list: SLOW_LIST,
    }
}

fn line(to: To, rv: u64) -> Line {
    Line {
        to,
        rv: Some(rv),
        bytes: Bytes::from(format!("{to:?}@{rv}")),
    }
}

fn send(id: u64, to: To, rv: u64) -> Effect {
    Effect::Seat(Out::Send(id, line(to, rv).bytes))
}

fn shards(s: &[u32]) -> BTreeSet<u32> {
    s.iter().copied().collect()
}

fn join(id: u64, shard: u32, from: Option<&str>) -> Input {
    Input::Join {
        id,
        shard,
        from: from.map(str::to_string),
    }
}

fn open(from: &str, s: &[u32]) -> Effect {
    Effect::Open {
        from: from.into(),
        shards: shards(s),
    }
}

fn opened(at: &str) -> Input {
    Input::Opened {
        at: at.into(),
        asked: None,
    }
}

/// The rows of the main watch closed and reopened from `from` at `ms` (for `s`), then opened.
fn reopens(ms: u64, from: &str, s: &[u32]) -> [(u64, Input, Vec<Effect>); 2] {
    [
        (ms, Input::Due, vec![Effect::CloseMain, open(from, s)]),
        (ms + 1, opened(from), vec![]),
    ]
}

/// Steps through `table`, each input at its offset from `t0`, asserting its effects.
fn run(hub: &mut Hub, t0: Instant, table: Vec<(u64, Input, Vec<Effect>)>) {
    for (i, (ms, input, want)) in table.into_iter().enumerate() {
        let what = format!("{input:?}");
        let got = hub.step(input, t0 + Duration::from_millis(ms));
        assert_eq!(got, want, "row {i}: {what}");
    }
}

/// The rows of a catch-up of `s` beginning at `ms`: the deadline, then the list opened.
fn catch_up_begins(ms: u64, s: &[u32]) -> [(u64, Input, Vec<Effect>); 2] {
    [
        (
            ms,
            Input::Due,
            vec![Effect::BeginCatchUp { shards: shards(s) }],
        ),
        (ms + 1, Input::CatchBegun { asked: None }, vec![]),
    ]
}

/// The rows of seat `id` of `shard` joining at `ms`, its catch-up beginning 500 ms later, and
/// an item of its shard at `rv` listed to it.
fn joins_and_lists(ms: u64, id: u64, shard: u32, rv: u64) -> Vec<(u64, Input, Vec<Effect>)> {
    let mut rows = vec![(ms, join(id, shard, None), vec![])];
    rows.extend(catch_up_begins(ms + 500, &[shard]));
    rows.push((
        ms + 502,
        Input::Listed(line(To::Shard(shard), rv)),
        vec![send(id, To::Shard(shard), rv)],
    ));
    rows
}

/// A hub whose seat 1 (shard 0) is live on a main watch at 10, at `t0`.
fn live_one(t0: Instant) -> Hub {
    live_one_timed(t0, timing())
}

/// The same, waiting as `timing` says.
fn live_one_timed(t0: Instant, timing: Timing) -> Hub {
    let mut hub = Hub::new(timing, t0);
    run(
        &mut hub,
        t0,
        joins_and_lists(0, 1, 0, 5)
            .into_iter()
            .chain([
                // A bookmark of the list goes to nobody.
                (503, Input::Listed(line(To::All, 6)), vec![]),
                (
                    504,
                    Input::CaughtUp {
                        rv: "10".into(),
                        watch: true,
                    },
                    vec![
                        Effect::CatchBecomesMain,
                        Effect::Seat(Out::End(1, "10".into())),
                    ],
                ),
            ])
            .collect(),
    );
    hub
}

#[test]
fn a_first_catch_up_waits_for_quiet_joins_and_goes_on_as_the_main_watch() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    hub.step(join(1, 0, None), t0);
    assert_eq!(hub.deadline(), Some(t0 + QUIET));
    // Another join pushes the catch-up back.
    hub.step(join(2, 1, None), t0 + Duration::from_millis(300));
    assert_eq!(hub.deadline(), Some(t0 + Duration::from_millis(800)));
    let hub = live_one(t0);
    assert_eq!(
        hub.deadline(),
        None,
        "nothing to do while the main watch runs"
    );
    assert_eq!(hub.board().position(), Some("10"));
}

/// The rows of shards claimed here starting, and seat 1 (shard 0) joining to be listed, at 0.
fn a_seat_while_shards_start() -> Vec<(u64, Input, Vec<Effect>)> {
    vec![
        (0, Input::Starting(true), vec![]),
        (0, join(1, 0, None), vec![]),
    ]
}

/// Shards claimed together start their streams over seconds (restores a few at a time, a
/// producer each): the catch-up waits for every part, past the quiet and `join_max`, so the
/// collection is read once for all of them; counted from the last one's start, the quiet
/// still holds.
#[test]
fn a_catch_up_waits_for_the_shards_still_starting() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    run(&mut hub, t0, a_seat_while_shards_start());
    assert_eq!(hub.deadline(), Some(t0 + START_MAX));
    run(
        &mut hub,
        t0,
        vec![
            (6_000, join(2, 1, None), vec![]),
            (8_000, Input::Starting(false), vec![]),
        ],
    );
    assert_eq!(hub.deadline(), Some(t0 + Duration::from_millis(8_500)));
    let mut rows = vec![(8_100, join(3, 2, None), vec![])];
    rows.extend(catch_up_begins(8_500, &[0, 1, 2]));
    run(&mut hub, t0, rows);
}

/// A shard that never finishes starting, or shards claimed one after another (each starting
/// as the last ended), hold a waiting seat's catch-up for `start_max` after its join at most.
#[test]
fn starting_shards_hold_a_catch_up_for_start_max_at_most() {
    for claims_in_a_row in [0, 2] {
        let t0 = Instant::now();
        let mut hub = Hub::new(timing(), t0);
        let mut rows = a_seat_while_shards_start();
        for k in 1..=claims_in_a_row {
            rows.push((k * 10_000, Input::Starting(false), vec![]));
            rows.push((k * 10_000 + 100, Input::Starting(true), vec![]));
        }
        rows.extend(catch_up_begins(30_000, &[0]));
        run(&mut hub, t0, rows);
    }
}

#[test]
fn a_resuming_part_reopens_the_main_watch_from_its_position() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    run(
        &mut hub,
        t0,
        vec![
            (
                600,
                Input::Main(line(To::Shard(0), 20), Some("20".into())),
                vec![send(1, To::Shard(0), 20)],
            ),
            // A new owner's part resumes at 14, where the old owner's checkpoint stood.
            (700, join(2, 1, Some("14")), vec![]),
            // Not before joins are quiet.
            (1000, Input::Due, vec![]),
        ]
        .into_iter()
        .chain(reopens(1200, "14", &[0, 1]))
        .chain([
            // Every change after 14 reaches it, nothing twice reaches seat 1.
            (
                1202,
                Input::Main(line(To::Shard(1), 15), Some("15".into())),
                vec![send(2, To::Shard(1), 15)],
            ),
            (
                1203,
                Input::Main(line(To::Shard(0), 18), Some("18".into())),
                vec![],
            ),
            (
                1204,
                Input::Main(line(To::Shard(0), 21), Some("21".into())),
                vec![send(1, To::Shard(0), 21)],
            ),
        ])
        .collect(),
    );
    assert_eq!(hub.deadline(), None);
}

/// A busy shard whose changes outgrow what a seat may hold during a long list does not relist
/// again and again: its list ends its state, and its part resumes from the list's position.
#[test]
fn a_part_that_holds_too_much_during_its_list_resumes_from_the_list() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    let big = |rv: u64| Line {
        to: To::Shard(1),
        rv: Some(rv),
        bytes: Bytes::from(vec![b'x'; HELD_BYTES / 2 + 1]),
    };
    let mut rows = joins_and_lists(600, 2, 1, 11);
    rows.extend([
        (1110, Input::Main(big(12), Some("12".into())), vec![]),
        (1111, Input::Main(big(13), Some("13".into())), vec![]),
        (1112, Input::Main(big(14), Some("14".into())), vec![]),
        (
            1120,
            Input::CaughtUp {
                rv: "12".into(),
                watch: false,
            },
            vec![Effect::CloseCatch, Effect::Seat(Out::End(2, "12".into()))],
        ),
    ]);
    rows.extend(reopens(1620, "12", &[0, 1]));
    rows.extend([(
        1622,
        Input::Main(line(To::Shard(1), 13), Some("13".into())),
        vec![send(2, To::Shard(1), 13)],
    )]);
    run(&mut hub, t0, rows);
    assert_eq!(hub.deadline(), None);
}

/// A resuming part waits for the resume quiet only, shorter than a catch-up's: a new owner's
/// part reads after one reopen, while a part to be listed beside it waits for joins to be
/// quiet as long as a list asks.
#[test]
fn a_resume_waits_less_than_a_catch_up() {
    let t0 = Instant::now();
    let resume_quiet = Duration::from_millis(100);
    let mut hub = live_one_timed(
        t0,
        Timing {
            resume_quiet,
            ..timing()
        },
    );
    run(
        &mut hub,
        t0,
        vec![
            (
                600,
                Input::Main(line(To::Shard(0), 20), Some("20".into())),
                vec![send(1, To::Shard(0), 20)],
            ),
            (700, join(2, 1, Some("14")), vec![]),
            (700, join(3, 2, None), vec![]),
            (750, Input::Due, vec![]),
            (
                800,
                Input::Due,
                vec![Effect::CloseMain, open("14", &[0, 1, 2])],
            ),
            (801, opened("14"), vec![]),
            (
                802,
                Input::Main(line(To::Shard(1), 15), Some("15".into())),
                vec![send(2, To::Shard(1), 15)],
            ),
        ],
    );
    assert_eq!(
        hub.deadline(),
        Some(t0 + Duration::from_millis(700) + QUIET)
    );
}

/// Parts resuming one after another, each reopening the main watch sooner than a list is
/// begun, do not put off the catch-up a part waits for: it begins `join_max` after that part
/// joined at the latest.
#[test]
fn resumes_in_a_row_do_not_put_a_waiting_catch_up_off() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let timing = Timing {
        resume_quiet: Duration::from_millis(100),
        ..timing()
    };
    let mut hub = live_one_timed(t0, timing);
    hub.step(
        Input::Main(line(To::Shard(0), 20), Some("20".into())),
        at(600),
    );
    // A part waits for a list.
    hub.step(join(2, 1, None), at(700));
    let mut began = None;
    for (i, ms) in (700..7000).step_by(400).enumerate() {
        hub.step(join(10 + i as u64, 2, Some("14")), at(ms));
        let fx = hub.step(Input::Due, at(ms + 100));
        if began.is_none() && fx.iter().any(|e| matches!(e, Effect::BeginCatchUp { .. })) {
            began = Some(ms + 100);
        }
    }
    let began = began.expect("the catch-up never began");
    assert!(
        at(began) <= at(700) + timing.join_max + Duration::from_millis(400),
        "the catch-up began {began} ms in"
    );
}

/// A hub whose seat 1 is live at 10 and whose seat 2 joined at 600 to resume from 3, the
/// main watch being reopened there at 1100.
fn reopening_for_a_resume_at_3(t0: Instant) -> Hub {
    let mut hub = live_one(t0);
    run(
        &mut hub,
        t0,
        vec![
            (600, join(2, 1, Some("3")), vec![]),
            (
                1100,
                Input::Due,
                vec![Effect::CloseMain, open("3", &[0, 1])],
            ),
        ],
    );
    hub
}

#[test]
fn a_position_the_server_no_longer_holds_expires_only_the_parts_that_needed_it() {
    let t0 = Instant::now();
    let mut hub = reopening_for_a_resume_at_3(t0);
    run(
        &mut hub,
        t0,
        vec![
            (
                1101,
                Input::OpenFailed {
                    at: "3".into(),
                    gone: true,
                    retry_after: None,
                },
                vec![Effect::Seat(Out::Expire(2))],
            ),
            // The main watch reopens from its own position at once: seat 1 lives on.
            (1101, Input::Due, vec![open("10", &[0])]),
            (1102, opened("10"), vec![]),
        ],
    );
    assert_eq!(hub.board().position(), Some("10"));
}

/// A real API server answers a watch from a position it no longer holds with an error event,
/// not a 410 status: the same as a failed open, when it comes before the first line.
#[test]
fn an_error_event_answering_a_reopen_expires_only_the_parts_that_needed_it() {
    let t0 = Instant::now();
    let mut hub = reopening_for_a_resume_at_3(t0);
    run(
        &mut hub,
        t0,
        vec![
            (1101, opened("3"), vec![]),
            (
                1102,
                Input::MainError,
                vec![Effect::CloseMain, Effect::Seat(Out::Expire(2))],
            ),
            // The main watch reopens from its own position at once: seat 1 lives on.
            (1102, Input::Due, vec![open("10", &[0])]),
            (1103, opened("10"), vec![]),
            (
                1104,
                Input::Main(line(To::Shard(0), 11), Some("11".into())),
                vec![send(1, To::Shard(0), 11)],
            ),
            // Once a line came, an error event is a gap.
            (
                1105,
                Input::MainError,
                vec![Effect::CloseMain, Effect::Seat(Out::Expire(1))],
            ),
        ],
    );
    assert_eq!(hub.board().position(), None);
}

#[test]
fn failed_reopens_back_off_and_relist_nothing() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    let failed = |retry_after| Input::OpenFailed {
        at: "10".into(),
        gone: false,
        retry_after,
    };
    // The main watch ends; each failed reopen (a 504, a 403, a 5xx) waits twice as long, up
    // to 30 s, or what the server said; no seat expires.
    hub.step(Input::MainEnded, t0);
    let mut at = t0;
    for wait in [1, 2, 4, 8, 16, 30, 30] {
        assert_eq!(hub.step(Input::Due, at), vec![open("10", &[0])]);
        assert_eq!(hub.step(failed(None), at), vec![]);
        assert_eq!(hub.deadline(), Some(at + Duration::from_secs(wait)));
        at += Duration::from_secs(wait);
    }
    hub.step(Input::Due, at);
    hub.step(failed(Some(Duration::from_secs(7))), at);
    assert_eq!(hub.deadline(), Some(at + Duration::from_secs(7)));
    // Opened at last: the backoff starts over.
    at += Duration::from_secs(7);
    hub.step(Input::Due, at);
    assert_eq!(hub.step(opened("10"), at), vec![]);
    hub.step(Input::MainEnded, at);
    hub.step(Input::Due, at);
    hub.step(failed(None), at);
    assert_eq!(hub.deadline(), Some(at + Duration::from_secs(1)));
    assert!(hub.board().has_shard(0), "the live seat stayed");
}

#[test]
fn a_catch_up_that_fails_midway_expires_its_seats() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    run(
        &mut hub,
        t0,
        joins_and_lists(600, 2, 1, 4)
            .into_iter()
            .chain([
                // Cut after part of the list: seat 2 restarts its sync (and reconciles).
                (
                    1103,
                    Input::CatchFailed {
                        begun: true,
                        retry_after: None,
                    },
                    vec![Effect::CloseCatch, Effect::Seat(Out::Expire(2))],
                ),
            ])
            .collect(),
    );
    assert!(!hub.board().has_shard(1));
}

#[test]
fn heartbeats_go_only_while_a_main_watch_runs() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    let beat = || Input::Beat { gone: vec![] };
    run(
        &mut hub,
        t0,
        vec![
            (1000, beat(), vec![Effect::Bookmark(vec![(1, "10".into())])]),
            (1001, Input::MainEnded, vec![Effect::CloseMain]),
            // The reopen keeps failing: parts hear nothing, stall and say so.
            (1002, Input::Due, vec![open("10", &[0])]),
            (
                1003,
                Input::OpenFailed {
                    at: "10".into(),
                    gone: false,
                    retry_after: None,
                },
                vec![],
            ),
            (1500, beat(), vec![]),
        ],
    );
}

#[test]
fn a_silent_main_watch_is_reopened_and_an_error_event_is_a_gap() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    let silent = 504 + IDLE.as_millis() as u64;
    run(
        &mut hub,
        t0,
        vec![
            (
                silent,
                Input::Beat { gone: vec![] },
                vec![Effect::Silent, Effect::CloseMain],
            ),
            (silent, Input::Due, vec![open("10", &[0])]),
            (silent + 1, opened("10"), vec![]),
            (
                silent + 2,
                Input::MainError,
                vec![Effect::CloseMain, Effect::Seat(Out::Expire(1))],
            ),
        ],
    );
    assert_eq!(hub.deadline(), None);
}

#[test]
fn a_main_watch_asking_for_a_departed_shard_narrows_a_moment_later() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let asked = |s: &[u32]| Some((shards(s), Cover::everything()));
    run(
        &mut hub,
        t0,
        vec![
            (0, join(1, 0, None), vec![]),
            (0, join(2, 1, None), vec![]),
            (
                500,
                Input::Due,
                vec![Effect::BeginCatchUp {
                    shards: shards(&[0, 1]),
                }],
            ),
            (
                501,
                Input::CatchBegun {
                    asked: asked(&[0, 1]),
                },
                vec![],
            ),
            (
                502,
                Input::CaughtUp {
                    rv: "10".into(),
                    watch: true,
                },
                vec![
                    Effect::CatchBecomesMain,
                    Effect::Seat(Out::End(1, "10".into())),
                    Effect::Seat(Out::End(2, "10".into())),
                ],
            ),
            (600, Input::Leave(2), vec![]),
            (1100, Input::Due, vec![Effect::CloseMain, open("10", &[0])]),
        ],
    );
}

#[test]
fn a_catch_up_wider_than_the_filtered_main_watch_reopens_it() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let asked = |s: &[u32]| Some((shards(s), Cover::everything()));
    hub.step(join(1, 0, None), t0);
    hub.step(Input::Due, t0 + QUIET);
    hub.step(Input::CatchBegun { asked: asked(&[0]) }, t0 + QUIET);
    hub.step(
        Input::CaughtUp {
            rv: "10".into(),
            watch: true,
        },
        t0 + QUIET,
    );
    hub.step(join(2, 1, None), t0 + QUIET);
    let later = t0 + QUIET * 2;
    assert_eq!(
        hub.step(Input::Due, later),
        vec![Effect::BeginCatchUp {
            shards: shards(&[1])
        }]
    );
    // The main watch asked for shard 0 only: it reopens from its position, below the list.
    assert_eq!(
        hub.step(Input::CatchBegun { asked: asked(&[1]) }, later),
        vec![Effect::CloseMain]
    );
    assert_eq!(hub.step(Input::Due, later), vec![open("10", &[0, 1])]);
}

#[test]
fn nobody_reading_closes_every_read() {
    let t0 = Instant::now();
    let mut hub = live_one(t0);
    run(
        &mut hub,
        t0,
        vec![(1000, Input::Beat { gone: vec![1] }, vec![Effect::CloseMain])],
    );
    assert_eq!(hub.board().position(), None);
    assert_eq!(hub.deadline(), None);
}

#[test]
fn a_namespace_the_reads_were_not_asked_for_relists_its_shard() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let known = vec![(100, 0)];
    let asked = Some((shards(&[0]), Cover::of(&known, &shards(&[0]), 400)));
    hub.step(join(1, 0, None), t0);
    hub.step(Input::Due, t0 + QUIET);
    hub.step(Input::CatchBegun { asked }, t0 + QUIET);
    hub.step(
        Input::CaughtUp {
            rv: "10".into(),
            watch: true,
        },
        t0 + QUIET,
    );
    // Nothing new: nothing relists.
    let same = std::sync::Arc::new(known.clone());
    assert_eq!(hub.step(Input::Namespaces(same), t0 + QUIET), vec![]);
    // A namespace of shard 0 created outside every range asked for.
    let more = std::sync::Arc::new(vec![(5, 0), (100, 0)]);
    assert_eq!(
        hub.step(Input::Namespaces(more), t0 + QUIET),
        vec![Effect::Missed(shards(&[0])), Effect::Seat(Out::Expire(1))]
    );
}

/// An item of `shard` listed by a server whose resourceVersions are not integers.
fn unordered_item(shard: u32) -> Line {
    Line {
        to: To::Shard(shard),
        rv: None,
        bytes: Bytes::from(format!("item of {shard}")),
    }
}

/// The rows of seat 1 (shard 0) joining, listed an item, and going live on a main watch at
/// `x10`, a position that is not an integer.
fn unordered_live_one() -> Vec<(u64, Input, Vec<Effect>)> {
    let mut rows = vec![(0, join(1, 0, None), vec![])];
    rows.extend(catch_up_begins(500, &[0]));
    rows.extend([
        (
            502,
            Input::Listed(unordered_item(0)),
            vec![Effect::Seat(Out::Send(1, unordered_item(0).bytes))],
        ),
        (
            503,
            Input::CaughtUp {
                rv: "x10".into(),
                watch: true,
            },
            vec![
                Effect::CatchBecomesMain,
                Effect::Seat(Out::End(1, "x10".into())),
            ],
        ),
    ]);
    rows
}

/// A server whose resourceVersions are not integers: a main watch's lines cannot be set
/// against a list's position. A catch-up then closes the main watch and its seats relist with
/// the waiting ones, once: the catch-up goes on as the main watch, and nobody is expired at its
/// end (before, every seat listed while the main watch ran was, at every catch-up).
#[test]
fn positions_that_do_not_compare_relist_once_and_settle() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let item = unordered_item;
    let sent = |id: u64, shard: u32| Effect::Seat(Out::Send(id, item(shard).bytes));
    let mut rows = unordered_live_one();
    rows.extend([
        // Another shard joins: the main watch closes and seat 1 relists with it.
        (1000, join(2, 1, None), vec![]),
        (
            1500,
            Input::Due,
            vec![Effect::CloseMain, Effect::Seat(Out::Expire(1))],
        ),
        // Seat 1's part rejoins.
        (1510, join(3, 0, None), vec![]),
    ]);
    rows.extend(catch_up_begins(2010, &[0, 1]));
    rows.extend([
        (2012, Input::Listed(item(1)), vec![sent(2, 1)]),
        (2013, Input::Listed(item(0)), vec![sent(3, 0)]),
        (
            2014,
            Input::CaughtUp {
                rv: "x20".into(),
                watch: true,
            },
            vec![
                Effect::CatchBecomesMain,
                Effect::Seat(Out::End(2, "x20".into())),
                Effect::Seat(Out::End(3, "x20".into())),
            ],
        ),
    ]);
    run(&mut hub, t0, rows);
    assert_eq!(hub.deadline(), None, "settled");
}

/// The same when the catch-up came due by `join_max` (joins never quiet): the seats it expires
/// are waited for, quiet again, not left out of a catch-up that begins at once.
#[test]
fn positions_that_do_not_compare_wait_for_the_expired_seats_whatever_made_the_catch_up_due() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let mut rows = unordered_live_one();
    // Joins every 400 ms: never quiet, so the catch-up is due 5 s after the first.
    for (i, ms) in (1000..6000).step_by(400).enumerate() {
        rows.push((ms, join(10 + i as u64, 1, None), vec![]));
    }
    rows.push((
        6000,
        Input::Due,
        vec![Effect::CloseMain, Effect::Seat(Out::Expire(1))],
    ));
    run(&mut hub, t0, rows);
    assert_eq!(
        hub.deadline(),
        Some(t0 + Duration::from_millis(6000) + QUIET),
        "the expired seat is waited for"
    );
}

/// Seat 1 (shard 0) live at 10, and seat 2 (shard 1) resumed live at 10.
fn live_two(t0: Instant) -> Hub {
    let mut hub = live_one(t0);
    run(
        &mut hub,
        t0,
        std::iter::once((600, join(2, 1, Some("10")), vec![]))
            .chain(reopens(1200, "10", &[0, 1]))
            .collect(),
    );
    hub
}

/// A line of shard `shard` at `rv` from the head of seat `id`'s queue.
fn drain(id: u64, shard: u32, rv: u64) -> Effect {
    Effect::Drain(Out::Send(id, line(To::Shard(shard), rv).bytes))
}

fn main_line(shard: u32, rv: u64) -> Input {
    Input::Main(line(To::Shard(shard), rv), Some(rv.to_string()))
}

/// Seat `id` had no room for its line of shard `shard` at `rv`.
fn no_room(id: u64, shard: u32, rv: u64) -> Input {
    Input::NoRoom(Out::Send(id, line(To::Shard(shard), rv).bytes))
}

/// `live_two`, then seat 1 with no room for its line at 11 (at 1301 ms), and its line at 12
/// queued behind it.
fn seat_1_stalled(t0: Instant) -> Hub {
    let mut hub = live_two(t0);
    run(
        &mut hub,
        t0,
        vec![
            (1300, main_line(0, 11), vec![send(1, To::Shard(0), 11)]),
            (1301, no_room(1, 0, 11), vec![]),
            (1302, main_line(0, 12), vec![]),
        ],
    );
    hub
}

/// S16: a part with no room holds up no other part. Its lines queue and go out in order once
/// it has room; a heartbeat does not pass them; the hub reads on for the others meanwhile.
#[test]
fn a_stalled_part_holds_up_no_other_and_gets_its_lines_in_order() {
    let t0 = Instant::now();
    // Seat 1 stalled, but seat 2 takes lines, so reading goes on.
    let mut hub = seat_1_stalled(t0);
    run(
        &mut hub,
        t0,
        vec![
            (1303, main_line(1, 13), vec![send(2, To::Shard(1), 13)]),
            (
                1304,
                Input::Beat { gone: vec![] },
                vec![Effect::Bookmark(vec![(2, "13".into())])],
            ),
            // Room: its lines, in order.
            (
                1305,
                Input::Room { id: 1, free: 512 },
                vec![drain(1, 0, 11), drain(1, 0, 12)],
            ),
            (1306, main_line(0, 14), vec![send(1, To::Shard(0), 14)]),
        ],
    );
    assert!(!hub.main_paused());
}

/// When every live part is stalled, the hub stops reading rather than queue, and a main watch
/// not read is not silent.
#[test]
fn a_hub_whose_every_part_is_stalled_pauses_and_is_not_silent() {
    let t0 = Instant::now();
    let mut hub = seat_1_stalled(t0);
    assert!(!hub.main_paused());
    hub.step(no_room(2, 1, 3), t0 + Duration::from_millis(1302));
    assert!(hub.main_paused());
    let later = 1302 + 2 * IDLE.as_millis() as u64;
    run(
        &mut hub,
        t0,
        vec![(later, Input::Beat { gone: vec![] }, vec![])],
    );
    hub.step(
        Input::Room { id: 2, free: 512 },
        t0 + Duration::from_millis(later + 1),
    );
    assert!(!hub.main_paused());
    // The idle timeout counts from the pause's last heartbeat.
    run(
        &mut hub,
        t0,
        vec![(
            later + 2,
            Input::Beat { gone: vec![] },
            vec![Effect::Bookmark(vec![(2, "12".into())])],
        )],
    );
}

/// A part that queues past its bound is let go, and its seat gets nothing more: its part
/// resumes from its position.
#[test]
fn a_part_queueing_too_much_is_let_go() {
    let t0 = Instant::now();
    let mut hub = live_two(t0);
    let big = |rv: u64| Line {
        to: To::Shard(0),
        rv: Some(rv),
        bytes: Bytes::from(vec![b'x'; crate::fanout::backlog::QUEUE_BYTES / 2 + 1]),
    };
    hub.step(
        Input::NoRoom(Out::Send(1, big(11).bytes)),
        t0 + Duration::from_millis(1300),
    );
    run(
        &mut hub,
        t0,
        vec![
            (
                1301,
                Input::Main(big(12), Some("12".into())),
                vec![Effect::LetGo(1)],
            ),
            (1302, main_line(0, 13), vec![]),
            (1303, main_line(1, 14), vec![send(2, To::Shard(1), 14)]),
        ],
    );
    assert!(!hub.stalled(1));
    assert_eq!(hub.board().ids().collect::<Vec<_>>(), vec![2]);
}

/// A list is not queued: a part being listed with no room holds its catch-up up, and is let go
/// once it has for `slow_list`, so that the others' list goes on.
#[test]
fn a_part_stalled_in_its_list_holds_the_list_up_for_a_while_at_most() {
    let t0 = Instant::now();
    let mut hub = Hub::new(timing(), t0);
    let listed = |shard, rv| Input::Listed(line(To::Shard(shard), rv));
    run(
        &mut hub,
        t0,
        [(0, join(1, 0, None), vec![]), (0, join(2, 1, None), vec![])]
            .into_iter()
            .chain(catch_up_begins(500, &[0, 1]))
            .chain([
                (502, listed(0, 5), vec![send(1, To::Shard(0), 5)]),
                (
                    503,
                    Input::NoRoom(Out::Send(1, line(To::Shard(0), 5).bytes)),
                    vec![],
                ),
            ])
            .collect(),
    );
    assert!(hub.catch_paused() && !hub.main_paused());
    let slow = 503 + SLOW_LIST.as_millis() as u64;
    assert_eq!(hub.deadline(), Some(t0 + Duration::from_millis(slow)));
    run(
        &mut hub,
        t0,
        vec![
            (slow - 1, Input::Due, vec![]),
            (slow, Input::Due, vec![Effect::LetGo(1)]),
            (slow + 1, listed(0, 6), vec![]),
            (slow + 2, listed(1, 7), vec![send(2, To::Shard(1), 7)]),
        ],
    );
    assert!(!hub.catch_paused());
}

/// Room for some of a stalled part's lines: that many go out, in order; the rest wait, and so
/// does what comes for it meanwhile. A part being listed does not keep the main watch read
/// while every live part is stalled.
#[test]
fn a_stalled_part_gets_as_many_lines_as_it_has_room_for() {
    let t0 = Instant::now();
    let mut hub = seat_1_stalled(t0);
    run(
        &mut hub,
        t0,
        vec![
            (1303, Input::Room { id: 1, free: 1 }, vec![drain(1, 0, 11)]),
            (1304, main_line(0, 13), vec![]),
            (
                1305,
                Input::Room { id: 1, free: 5 },
                vec![drain(1, 0, 12), drain(1, 0, 13)],
            ),
            (1306, main_line(0, 14), vec![send(1, To::Shard(0), 14)]),
            // Seat 3 joins and is listed; the live ones stall.
            (1400, join(3, 2, None), vec![]),
            (1401, no_room(1, 0, 15), vec![]),
            (1402, no_room(2, 1, 16), vec![]),
        ],
    );
    run(&mut hub, t0, catch_up_begins(1900, &[2]).into());
    assert!(
        hub.main_paused(),
        "a seat being listed kept the main watch read"
    );
    assert!(!hub.catch_paused());
}
