use std::time::{Duration, Instant};

use uuid::Uuid;

use super::*;

fn id(host: &str) -> HostId {
    HostId {
        fleet: "fleet01".to_owned(),
        host: host.to_owned(),
    }
}

fn agent(name: &str) -> AgentEntry {
    AgentEntry {
        id: Uuid::now_v7(),
        name: name.to_owned(),
        profile: "worker".to_owned(),
        status: "ready".to_owned(),
        since: 0,
    }
}

fn roster() -> Roster {
    Roster::new(
        HostId {
            fleet: "mac".to_owned(),
            host: "laptop".to_owned(),
        },
        RosterSettings::default(),
    )
}

#[test]
fn a_peer_joins_updates_and_ignores_stale_beats() {
    let mut r = roster();
    let mut peer = Roster::new(id("b"), RosterSettings::default());
    peer.set_local(vec![agent("w1")]);
    let now = Instant::now();
    let first = peer.next_beat(false);
    let second = peer.next_beat(false);
    assert_eq!(
        r.observe(id("b"), first.clone(), now),
        Change::Joined(id("b"))
    );
    assert_eq!(
        r.observe(id("b"), second.clone(), now),
        Change::Updated(id("b"))
    );
    assert_eq!(
        r.observe(id("b"), first, now),
        Change::Stale(id("b")),
        "older sequence of the same boot"
    );
    assert_eq!(
        r.observe(id("b"), second, now),
        Change::Stale(id("b")),
        "a repeated beat"
    );
    let view = r.view();
    assert_eq!(view.len(), 2);
    assert_eq!(view[1].agents[0].name, "w1");
}

#[test]
fn silence_makes_a_peer_suspect_then_reaped_on_time() {
    let mut r = roster();
    let mut peer = Roster::new(id("b"), RosterSettings::default());
    let t0 = Instant::now();
    r.observe(id("b"), peer.next_beat(false), t0);
    assert!(r.tick(t0 + Duration::from_secs(14)).is_empty());
    assert_eq!(
        r.tick(t0 + Duration::from_secs(15)),
        vec![Change::Suspected(id("b"))]
    );
    assert!(
        r.tick(t0 + Duration::from_secs(20)).is_empty(),
        "reported once"
    );
    assert_eq!(r.view()[1].state, PeerState::Suspect);
    assert_eq!(
        r.tick(t0 + Duration::from_secs(30)),
        vec![Change::Reaped(id("b"))]
    );
    assert_eq!(r.view().len(), 1);
}

#[test]
fn a_beat_revives_a_suspect_peer_and_a_new_boot_rejoins() {
    let mut r = roster();
    let mut peer = Roster::new(id("b"), RosterSettings::default());
    let t0 = Instant::now();
    r.observe(id("b"), peer.next_beat(false), t0);
    r.tick(t0 + Duration::from_secs(16));
    assert_eq!(
        r.observe(id("b"), peer.next_beat(false), t0 + Duration::from_secs(17)),
        Change::Updated(id("b"))
    );
    assert_eq!(r.view()[1].state, PeerState::Alive);
    let mut restarted = Roster::new(id("b"), RosterSettings::default());
    assert_eq!(
        r.observe(
            id("b"),
            restarted.next_beat(false),
            t0 + Duration::from_secs(18)
        ),
        Change::Joined(id("b")),
        "a new boot restarts the sequence"
    );
}

#[test]
fn leaving_removes_at_once_and_nobody_announces_for_this_host() {
    let mut r = roster();
    let mut peer = Roster::new(id("b"), RosterSettings::default());
    let now = Instant::now();
    r.observe(id("b"), peer.next_beat(false), now);
    assert_eq!(
        r.observe(id("b"), peer.next_beat(true), now),
        Change::Left(id("b"))
    );
    assert_eq!(r.view().len(), 1);
    let me = HostId {
        fleet: "mac".to_owned(),
        host: "laptop".to_owned(),
    };
    assert_eq!(
        r.observe(me.clone(), peer.next_beat(false), now),
        Change::Stale(me),
        "beats signed as this host are ignored"
    );
}

#[test]
fn agents_are_located_on_their_host() {
    let mut r = roster();
    let local = agent("primary");
    r.set_local(vec![local.clone()]);
    let mut peer = Roster::new(id("b"), RosterSettings::default());
    let remote = agent("w1");
    peer.set_local(vec![remote.clone()]);
    r.observe(id("b"), peer.next_beat(false), Instant::now());
    assert_eq!(r.locate(local.id).unwrap().host, "laptop");
    assert_eq!(r.locate(remote.id), Some(id("b")));
    assert_eq!(r.locate(Uuid::now_v7()), None);
}

#[test]
fn beat_intervals_stay_within_twenty_percent() {
    let r = roster();
    for _ in 0..200 {
        let d = r.next_interval();
        assert!(
            d >= Duration::from_secs(4) && d <= Duration::from_secs(6),
            "{d:?}"
        );
    }
}

#[test]
fn the_roster_is_complete_one_longest_beat_interval_after_it_began_listening() {
    let mut r = roster();
    let start = Instant::now();
    // Not listening yet, just started: the link is coming; keep waiting a little at a time.
    assert_eq!(r.first_round_left(start), Some(Duration::from_millis(50)));
    // Long after a start without ever listening (the broker down): nothing to wait for.
    assert_eq!(r.first_round_left(start + Duration::from_secs(11)), None);
    r.listening(start);
    r.listening(start + Duration::from_secs(3)); // the first call counts
    // The default beat is 5 s: every live host has beaten within 6.25 s.
    assert_eq!(
        r.first_round_left(start + Duration::from_secs(1)),
        Some(Duration::from_millis(5250))
    );
    assert_eq!(
        r.first_round_left(start + Duration::from_millis(6250)),
        None
    );
    assert_eq!(r.first_round_left(start + Duration::from_secs(60)), None);
}
