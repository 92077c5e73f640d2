use secrecy::{ExposeSecret, SecretString};
use uuid::Uuid;

use super::*;

const NOW: i64 = 1_800_000_000_000;
const SKEW: i64 = 120_000;

fn window() -> Window {
    Window {
        now_ms: NOW,
        skew_ms: SKEW,
    }
}

fn meta(origin_host: &str) -> Meta {
    Meta {
        version: VERSION,
        id: Uuid::now_v7(),
        kind: Kind::AgentMessage,
        origin: Party {
            fleet: "mac".to_owned(),
            host: origin_host.to_owned(),
        },
        dest: Party {
            fleet: "fleet01".to_owned(),
            host: "fleet01".to_owned(),
        },
        key_id: String::new(),
        created_ms: NOW,
        expires_ms: NOW + 300_000,
    }
}

fn message() -> Payload {
    Payload::AgentMessage(AgentMessage {
        v: VERSION,
        to: Uuid::now_v7(),
        from: None,
        text: "run the tests".to_owned(),
    })
}

fn setup() -> (HostKey, PinnedKeys) {
    let (key, _) = HostKey::generate().unwrap();
    let mut pins = PinnedKeys::default();
    pins.pin("mac", "laptop", *key.public());
    (key, pins)
}

#[test]
fn a_sealed_envelope_verifies_once() {
    let (key, pins) = setup();
    let sealed = seal(meta("laptop"), &message(), &key);
    let mut replay = MemoryReplayCache::default();
    assert_eq!(
        verify(&sealed, &pins, window(), &mut replay).unwrap(),
        message_with(&sealed)
    );
    assert_eq!(
        verify(&sealed, &pins, window(), &mut replay),
        Err(Refusal::Replayed)
    );
}

fn message_with(sealed: &Sealed) -> Payload {
    Payload::decode(sealed.meta.kind, &sealed.body).unwrap()
}

/// What a refusal must look like.
type Expected = fn(&Refusal) -> bool;

#[test]
fn every_tampering_is_refused() {
    let (key, pins) = setup();
    let (other, _) = HostKey::generate().unwrap();
    let base = seal(meta("laptop"), &message(), &key);
    let cases: Vec<(Sealed, Expected)> = vec![
        (
            {
                let mut s = base.clone();
                s.body.push(b' ');
                s
            },
            |r| *r == Refusal::BadSignature,
        ),
        (
            {
                let mut s = base.clone();
                s.meta.dest.host = "elsewhere".into();
                s
            },
            |r| *r == Refusal::BadSignature,
        ),
        (
            {
                let mut s = base.clone();
                s.meta.expires_ms += 1;
                s
            },
            |r| *r == Refusal::BadSignature,
        ),
        (
            {
                let mut s = base.clone();
                s.meta.origin.fleet = "fleet02".into();
                s
            },
            |r| matches!(r, Refusal::UnpinnedHost { .. }),
        ),
        (seal(meta("desktop"), &message(), &key), |r| {
            matches!(r, Refusal::UnpinnedHost { .. })
        }),
        (seal(meta("laptop"), &message(), &other), |r| {
            matches!(r, Refusal::WrongKey(_))
        }),
        (
            {
                let mut s = seal(meta("laptop"), &message(), &other);
                s.meta.key_id = key.public().key_id();
                s
            },
            |r| *r == Refusal::BadSignature,
        ),
        (
            {
                let mut s = base.clone();
                s.meta.version = 2;
                s
            },
            |r| *r == Refusal::Version(2),
        ),
        (
            {
                let mut s = base.clone();
                s.signature[0] ^= 1;
                s
            },
            |r| *r == Refusal::BadSignature,
        ),
    ];
    for (i, (sealed, expected)) in cases.into_iter().enumerate() {
        let refusal =
            verify(&sealed, &pins, window(), &mut MemoryReplayCache::default()).unwrap_err();
        assert!(expected(&refusal), "case {i}: {refusal:?}");
    }
}

#[test]
fn the_time_window_is_enforced() {
    let (key, pins) = setup();
    let mut early = meta("laptop");
    early.created_ms = NOW + SKEW + 1;
    early.expires_ms = NOW + 600_000;
    let mut expired = meta("laptop");
    expired.created_ms = NOW - 10_000;
    expired.expires_ms = NOW - 1;
    let mut forever = meta("laptop");
    forever.expires_ms = NOW + MAX_LIFETIME_MS + 1;
    for (m, want) in [
        (early, Refusal::Skew(SKEW + 1)),
        (expired, Refusal::Expired),
        (forever, Refusal::Lifetime(MAX_LIFETIME_MS + 1)),
    ] {
        let refusal = verify(
            &seal(m, &message(), &key),
            &pins,
            window(),
            &mut MemoryReplayCache::default(),
        )
        .unwrap_err();
        assert_eq!(refusal, want);
        assert!(refusal.after_signature(), "{refusal:?}");
    }
}

/// A message that waited out a long outage (in its sender's outbox, or its receiver's queue) is
/// taken in however long ago it was created, as long as it has not expired — and only once.
#[test]
fn a_long_delayed_envelope_is_taken_once() {
    let (key, pins) = setup();
    let mut delayed = meta("laptop");
    delayed.created_ms = NOW - 6 * 3600 * 1000;
    delayed.expires_ms = delayed.created_ms + MAX_LIFETIME_MS;
    let sealed = seal(delayed, &message(), &key);
    let mut cache = MemoryReplayCache::default();
    assert!(verify(&sealed, &pins, window(), &mut cache).is_ok());
    assert_eq!(
        verify(&sealed, &pins, window(), &mut cache),
        Err(Refusal::Replayed)
    );
    // The cache may forget it only once it has expired, when the window refuses it instead.
    cache.prune(sealed.meta.expires_ms + SKEW);
    let later = Window {
        now_ms: sealed.meta.expires_ms + 1,
        skew_ms: SKEW,
    };
    assert_eq!(
        verify(&sealed, &pins, later, &mut cache),
        Err(Refusal::Expired)
    );
}

#[test]
fn bodies_with_unknown_fields_or_versions_or_oversize_are_refused() {
    let (key, pins) = setup();
    // Hand-made bodies signed with the genuine key: authenticity is not the question here.
    let signed_body = |body: &[u8]| seal_raw(meta("laptop"), body.to_vec(), &key);
    let to = Uuid::now_v7();
    for (body, needle) in [
        (
            format!(r#"{{"v":1,"to":"{to}","text":"x","extra":1}}"#),
            "unknown field `extra`",
        ),
        (
            format!(r#"{{"v":2,"to":"{to}","text":"x"}}"#),
            "unknown body version 2",
        ),
        (format!(r#"{{"to":"{to}","text":"x"}}"#), "no version"),
        ("not json".to_owned(), "not JSON"),
    ] {
        let refusal = verify(
            &signed_body(body.as_bytes()),
            &pins,
            window(),
            &mut MemoryReplayCache::default(),
        )
        .unwrap_err();
        assert!(
            matches!(&refusal, Refusal::Malformed(m) if m.to_string().contains(needle)),
            "{refusal:?}"
        );
    }
    let huge = vec![b' '; MAX_BODY + 1];
    assert_eq!(
        verify(
            &signed_body(&huge),
            &pins,
            window(),
            &mut MemoryReplayCache::default()
        ),
        Err(Refusal::TooLarge(MAX_BODY + 1))
    );
}

/// Seals arbitrary body bytes (tests only).
fn seal_raw(mut meta: Meta, body: Vec<u8>, key: &HostKey) -> Sealed {
    meta.key_id = key.public().key_id();
    let mut sealed = seal(meta, &message(), key);
    sealed.body = body;
    sealed.signature = key.sign(&super::seal::canonical_for_tests(
        &sealed.meta,
        &sealed.body,
    ));
    sealed
}

#[test]
fn host_key_round_trips_through_its_secret_and_never_shows_it() {
    let (key, stored) = HostKey::generate().unwrap();
    let again = HostKey::from_secret(&stored).unwrap();
    assert_eq!(key.public(), again.public());
    #[expect(
        clippy::disallowed_methods,
        reason = "the test checks the seed is absent from Debug"
    )]
    let seed = stored
        .expose_secret()
        .trim_start_matches("ed25519-seed:")
        .to_owned();
    assert!(!format!("{key:?}").contains(&seed));
    let public = key.public().to_string();
    assert_eq!(PublicKey::parse(&public).unwrap(), *key.public());
    assert!(HostKey::from_secret(&SecretString::from("ed25519-seed:short")).is_err());
    assert!(PublicKey::parse("ed25519:AAAA").is_err());
}

#[test]
fn replay_cache_forgets_only_expired_entries() {
    let mut cache = MemoryReplayCache::default();
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    assert!(cache.insert_new("k", a, 100));
    assert!(cache.insert_new("k", b, 300));
    cache.prune(200);
    assert!(cache.insert_new("k", a, 400), "expired entry forgotten");
    assert!(!cache.insert_new("k", b, 300), "live entry kept");
}

#[test]
fn a_receipt_reports_on_a_bounded_list_of_messages() {
    let ids: Vec<Uuid> = (0..=MAX_RECEIPT_MORE + 1).map(|_| Uuid::now_v7()).collect();
    let receipt = |more: &[Uuid]| DeliveryReceipt {
        v: VERSION,
        message: ids[0],
        state: DeliveryState::Delivered,
        reason: None,
        more: more.to_vec(),
    };
    // A single receipt is encoded as before (no `more`), so it reads the same everywhere.
    let single = Payload::DeliveryReceipt(receipt(&[])).encode();
    assert!(!String::from_utf8_lossy(&single).contains("more"));
    let full = Payload::DeliveryReceipt(receipt(&ids[1..=MAX_RECEIPT_MORE]));
    let Ok(Payload::DeliveryReceipt(back)) = Payload::decode(Kind::DeliveryReceipt, &full.encode())
    else {
        panic!("a receipt at the bound decodes");
    };
    assert_eq!(
        back.messages().collect::<Vec<_>>(),
        ids[..=MAX_RECEIPT_MORE].to_vec()
    );
    let over = Payload::DeliveryReceipt(receipt(&ids[1..])).encode();
    let refusal = Payload::decode(Kind::DeliveryReceipt, &over).unwrap_err();
    assert!(
        refusal
            .to_string()
            .contains(&format!("more than {} messages", MAX_RECEIPT_MORE + 1)),
        "{refusal}"
    );
}
