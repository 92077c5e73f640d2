use std::path::Path;

use super::*;
use crate::state::Limits;

fn registry(dir: &Path) -> Registry {
    Registry::load(Arc::new(StateStore::open(dir, Limits::default()).unwrap())).unwrap()
}

/// Registers a pane agent the way a spawn does: reserve, then register.
fn register(
    agents: &Registry,
    name: &str,
    profile: &str,
    pane: &str,
    owner: Owner,
) -> Result<Uuid, RegistryError> {
    let id = agents.reserve(Some(name), &owner)?;
    agents.register(Registration {
        id,
        name: name.to_owned(),
        profile: profile.to_owned(),
        pane: pane.to_owned(),
        owner,
        token: None,
        process: None,
        grant: None,
    })
}

fn peer(fleet: &str, host: &str) -> Owner {
    Owner::Peer {
        agent: None,
        fleet: fleet.to_owned(),
        host: host.to_owned(),
    }
}

#[test]
fn a_held_name_is_never_handed_to_another_agent_whoever_asks() {
    let dir = tempfile::tempdir().unwrap();
    let agents = registry(dir.path());
    let primary = agents.open_mailbox("primary").unwrap();
    let worker = register(&agents, "w1", "worker", "%3", peer("b", "x")).unwrap();
    for owner in [peer("b", "x"), peer("c", "y"), Owner::Operator, Owner::Lead] {
        for (name, holder) in [("primary", primary), ("w1", worker)] {
            assert!(
                matches!(agents.reserve(Some(name), &owner), Err(RegistryError::NameHeld { id, .. }) if id == holder),
                "{owner} may not take `{name}`"
            );
            assert!(
                matches!(register(&agents, name, "evil", "%9", owner.clone()), Err(RegistryError::NameHeld { id, .. }) if id == holder),
                "{owner} did not get `{name}`"
            );
        }
    }
    // The holders are unchanged: same pane (none for the mailbox), same profile.
    assert_eq!(agents.pane_of(primary), None);
    assert_eq!(agents.agent(worker).unwrap().pane.as_deref(), Some("%3"));
    assert_eq!(agents.agent(worker).unwrap().profile, "worker");
    // The operator's `agent open` of a held name tells the holder's id, and moves nothing.
    assert_eq!(agents.open_mailbox("w1").unwrap(), worker);
    assert_eq!(agents.agent(worker).unwrap().pane.as_deref(), Some("%3"));
}

#[test]
fn each_registration_mints_a_new_id_and_only_a_lead_relaunch_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let agents = registry(dir.path());
    let a = register(&agents, "a", "p", "%1", Owner::Operator).unwrap();
    let b = register(&agents, "b", "p", "%2", Owner::Operator).unwrap();
    assert_ne!(a, b);
    let lead = register(&agents, "reviewer", "p", "%4", Owner::Lead).unwrap();
    agents.set_status(lead, Status::Down, None);
    let again = register(&agents, "reviewer", "p", "%5", Owner::Lead).unwrap();
    assert_eq!(again, lead, "a relaunched lead keeps its id");
    let relaunched = agents.agent(lead).unwrap();
    assert_eq!(relaunched.pane.as_deref(), Some("%5"));
    assert_eq!(
        relaunched.status(),
        Status::Ready,
        "the new pane passed its gate"
    );
    // A lead name held by something else is not the supervisor's to take.
    agents.open_mailbox("notes").unwrap();
    assert!(register(&agents, "notes", "p", "%6", Owner::Lead).is_err());
}

#[test]
fn free_names_count_up_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agents = registry(dir.path());
    assert_eq!(agents.free_name("worker-3"), "worker-3");
    register(&agents, "worker-3", "p", "%3", Owner::Operator).unwrap();
    register(&agents, "worker-3-2", "p", "%4", Owner::Operator).unwrap();
    assert_eq!(agents.free_name("worker-3"), "worker-3-3");
    // herdr's pane ids hold characters a name may not: the default name is still a name.
    assert_eq!(agents.free_name("worker-w1:p2"), "worker-w1-p2");
    let long = agents.free_name(&"n".repeat(MAX_NAME * 2));
    assert!(long.len() <= MAX_NAME - 8, "{long}");
    register(&agents, &long, "p", "%5", Owner::Operator).unwrap();
    let next = agents.free_name(&"n".repeat(MAX_NAME * 2));
    assert_eq!(next, format!("{long}-2"));
    register(&agents, &next, "p", "%6", Owner::Operator).unwrap();
    assert_eq!(agents.free_name(""), "agent");
    for bad in ["", "a b", "x;y", "ünï", &"n".repeat(MAX_NAME + 1)] {
        assert!(
            matches!(agents.open_mailbox(bad), Err(RegistryError::BadName)),
            "{bad:?}"
        );
        assert!(matches!(
            agents.reserve(Some(bad), &Owner::Operator),
            Err(RegistryError::BadName)
        ));
    }
}

#[test]
fn agents_and_their_owners_survive_a_restart_and_old_records_are_the_operators() {
    let dir = tempfile::tempdir().unwrap();
    let (primary, worker) = {
        let agents = registry(dir.path());
        let primary = agents.open_mailbox("primary").unwrap();
        let worker = register(&agents, "w1", "worker", "%3", peer("b", "x")).unwrap();
        (primary, worker)
    };
    let agents = registry(dir.path());
    assert_eq!(agents.named("primary").unwrap().0, primary);
    assert_eq!(agents.agent(worker).unwrap().owner, peer("b", "x"));
    // A record written before owners were kept.
    let old = br#"{"name":"old","profile":"p","since_ms":1,"pane":"%7","status":"ready"}"#;
    let old_id = Uuid::now_v7();
    let state = Arc::new(StateStore::open(&dir.path().join("old"), Limits::default()).unwrap());
    state.agent_put(old_id, old).unwrap();
    let agents = Registry::load(state).unwrap();
    let record = agents.agent(old_id).unwrap();
    assert_eq!(record.owner, Owner::Operator);
    assert_eq!(record.status(), Status::Ready);
}

#[test]
fn a_name_taken_while_a_launch_waited_for_its_gate_is_refused_at_registration() {
    let dir = tempfile::tempdir().unwrap();
    let agents = registry(dir.path());
    let first = agents.reserve(Some("w"), &Owner::Operator).unwrap();
    let second = agents.reserve(Some("w"), &peer("b", "x")).unwrap();
    assert_ne!(first, second);
    let registration = |id, owner| Registration {
        id,
        name: "w".to_owned(),
        profile: "p".to_owned(),
        pane: "%1".to_owned(),
        owner,
        token: None,
        process: None,
        grant: None,
    };
    agents
        .register(registration(second, peer("b", "x")))
        .unwrap();
    assert!(matches!(
        agents.register(registration(first, Owner::Operator)),
        Err(RegistryError::NameHeld { id, .. }) if id == second
    ));
}

#[test]
fn a_token_names_its_agent_until_it_is_revoked_and_bad_tokens_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let agents = registry(dir.path());
    let (token, hash) = token::mint().unwrap();
    let (other, _) = token::mint().unwrap();
    let id = agents.reserve(Some("w"), &Owner::Operator).unwrap();
    agents
        .register(Registration {
            id,
            name: "w".to_owned(),
            profile: "p".to_owned(),
            pane: "%1".to_owned(),
            owner: Owner::Operator,
            token: Some(hash),
            process: None,
            grant: None,
        })
        .unwrap();
    assert_eq!(agents.authenticate(&token).unwrap().0, id);
    assert_eq!(
        agents.authenticate(&other).unwrap_err(),
        TokenError::Unknown
    );
    #[expect(clippy::disallowed_methods, reason = "the test cuts a token short")]
    let text = secrecy::ExposeSecret::expose_secret(&token).to_owned();
    for bad in [
        &text[..text.len() - 1],
        "",
        "Bearer x",
        &text[token::PREFIX.len()..],
    ] {
        let bad = secrecy::SecretString::from(bad.to_owned());
        assert_eq!(
            agents.authenticate(&bad).unwrap_err(),
            TokenError::Malformed
        );
    }
    // The record keeps only the hash.
    let record = String::from_utf8(
        agents
            .state
            .agents_list()
            .unwrap()
            .into_iter()
            .next()
            .unwrap()
            .1,
    )
    .unwrap();
    assert!(!record.contains(&text[token::PREFIX.len()..]), "{record}");
    let (_, stale) = token::mint().unwrap();
    agents
        .revoke(id, stale, "a token it no longer holds")
        .unwrap();
    assert_eq!(agents.authenticate(&token).unwrap().0, id, "still valid");
    agents
        .revoke(id, hash, "its process exited with status 0")
        .unwrap();
    assert_eq!(
        agents.authenticate(&token).unwrap_err(),
        TokenError::Revoked {
            agent: id,
            why: "its process exited with status 0".to_owned()
        }
    );
    assert_eq!(agents.agent(id).unwrap().status(), Status::Down);
    // After a restart a revoked token is simply unknown.
    drop(agents);
    assert_eq!(
        registry(dir.path()).authenticate(&token).unwrap_err(),
        TokenError::Unknown
    );
}
