use secrecy::SecretString;

use super::*;

const CANARY: &str = "c4n4ry-S3cret-7f3a91";

#[test]
fn resolved_debug_never_shows_the_value() {
    let resolved = Resolved {
        name: SecretName::new("broker-uri").unwrap(),
        source: Source::Keyring,
        value: SecretString::from(CANARY),
    };
    let text = format!("{resolved:?}");
    assert!(!text.contains(CANARY), "{text}");
    assert!(text.contains("broker-uri"));
}

#[test]
fn broker_uri_parses_without_showing_the_password() {
    let secret = SecretString::from(format!(
        "amqps://fleet01:{CANARY}@broker.example:5671/fleet01?heartbeat=5"
    ));
    let uri = BrokerUri::parse(&secret).unwrap();
    assert!(uri.tls);
    assert_eq!(
        (uri.user.as_str(), uri.node_list().as_str()),
        ("fleet01", "broker.example:5671")
    );
    assert_eq!((uri.vhost.as_str(), uri.heartbeat), ("fleet01", 5));
    let text = format!("{uri:?}");
    assert!(!text.contains(CANARY), "{text}");
}

#[test]
fn broker_uri_defaults_and_percent_decoding() {
    let uri = BrokerUri::parse(&SecretString::from("amqp://u:p%40ss@127.0.0.1/%2Fmac")).unwrap();
    assert_eq!(
        (uri.nodes[0].port, uri.vhost.as_str(), uri.heartbeat),
        (5672, "/mac", 10)
    );
    let uri = BrokerUri::parse(&SecretString::from("amqp://u:pw@[::1]:5673")).unwrap();
    assert_eq!(
        (
            uri.nodes[0].host.as_str(),
            uri.nodes[0].port,
            uri.vhost.as_str()
        ),
        ("::1", 5673, "/")
    );
    assert_eq!(uri.node_list(), "[::1]:5673");
}

#[test]
fn broker_uri_names_several_nodes_and_moves_past_a_lost_one() {
    let secret = SecretString::from(format!(
        "amqps://fleet01:{CANARY}@n1.example,n2.example:5681,[::1]:5682/fleet01"
    ));
    let uri = BrokerUri::parse(&secret).unwrap();
    assert_eq!(
        uri.node_list(),
        "n1.example:5671,n2.example:5681,[::1]:5682"
    );
    assert_eq!(uri.ports(), vec![5671, 5681, 5682]);
    assert!(!format!("{uri:?}").contains(CANARY));
    // Whatever the random first choice, a lost node hands over to the next, wrapping.
    for index in 0..3 {
        uri.opened(index);
        assert_eq!(uri.first_choice(), index);
        uri.lost(index);
        assert_eq!(uri.first_choice(), (index + 1) % 3);
    }
    // A loss reported late (another connection already moved on) does not move it back.
    uri.opened(2);
    uri.lost(0);
    assert_eq!(uri.first_choice(), 2);
    // The first choice is spread over the nodes (random per parse).
    let firsts: std::collections::BTreeSet<usize> = (0..64)
        .map(|_| BrokerUri::parse(&secret).unwrap().first_choice())
        .collect();
    assert!(firsts.len() > 1, "{firsts:?}");
}

#[test]
fn broker_uri_errors_never_contain_the_uri() {
    let bad = [
        (format!("http://u:{CANARY}@h/"), UriError::Scheme),
        (format!("amqp://{CANARY}@h/"), UriError::Userinfo),
        (format!("amqp://u:{CANARY}@h:99999/"), UriError::Port),
        (format!("amqp://u:{CANARY}%zz@h/"), UriError::Escape),
        (format!("amqp://u:{CANARY}@h/?x={CANARY}"), UriError::Query),
        (format!("amqp://u:{CANARY}@h:1,h:1/"), UriError::Nodes),
        (format!("amqp://u:{CANARY}@h:1,,h:2/"), UriError::Host),
        (
            format!(
                "amqp://u:{CANARY}@{}/",
                (1..=17)
                    .map(|p| format!("h:{p}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            UriError::Nodes,
        ),
    ];
    for (uri, expected) in bad {
        let error = BrokerUri::parse(&SecretString::from(uri)).unwrap_err();
        assert_eq!(error, expected);
        assert!(!error.to_string().contains(CANARY));
        assert!(!format!("{error:?}").contains(CANARY));
    }
}

#[test]
fn secret_names_are_restricted() {
    for good in ["broker-uri", "host-key", "github.token", "a1"] {
        assert!(SecretName::new(good).is_ok(), "{good}");
    }
    for bad in ["", "../x", "a/b", "Upper", "-lead", "a..b", &"x".repeat(65)] {
        assert!(SecretName::new(bad).is_err(), "{bad}");
    }
}

#[test]
fn credential_file_is_read_and_trailing_newline_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker-uri");
    std::fs::write(&path, format!("{CANARY}\n")).unwrap();
    let name = SecretName::new("broker-uri").unwrap();
    let value = read_credential(&name, &path).unwrap().unwrap();
    #[expect(
        clippy::disallowed_methods,
        reason = "the test compares the loaded value"
    )]
    let plain = secrecy::ExposeSecret::expose_secret(&value).to_owned();
    assert_eq!(plain, CANARY);
    assert!(
        read_credential(&name, &dir.path().join("absent"))
            .unwrap()
            .is_none()
    );
}
