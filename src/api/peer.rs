//! Who is on the other end of a local API connection, told apart by the kernel (SO_PEERCRED):
//! root, fleetd's own user and members of the configured operator group are the operator; any
//! other peer gets only what an agent token it presents allows, and nothing without one.
//!
//! Group membership is read from `/etc/group` (and the peer's primary group) on each connection
//! from a peer that is neither root nor fleetd's user, so a change to the group takes effect
//! without a restart. Only the files database is consulted (no NSS modules: fleetd's sandbox
//! reads no directory services); an operator group kept in LDAP or sssd is not seen.

use std::path::Path;

/// The file the operator group is looked up in.
const GROUP_FILE: &str = "/etc/group";

/// Who may reach the socket at all (the kernel's file modes; every peer is classed after).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SocketAccess {
    /// fleetd's own user (and root): directory 0700, socket 0600. For a host where fleetd and
    /// its agents share one user.
    #[default]
    Owner,
    /// Every local user may connect (directory 0711, socket 0666): agents under their own
    /// user reach the API with their tokens; peers that are not the operator and present no
    /// token are refused and audited.
    AllUsers,
}

impl SocketAccess {
    /// (directory mode, socket mode).
    pub fn modes(self) -> (u32, u32) {
        match self {
            SocketAccess::Owner => (0o700, 0o600),
            SocketAccess::AllUsers => (0o711, 0o666),
        }
    }
}

/// What a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerClass {
    /// Root, fleetd's own user, or a member of the operator group.
    Operator,
    /// Anyone else: an agent token is needed.
    Other,
}

/// The kernel's word on a connected peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its uid.
    pub uid: u32,
    /// Its gid (effective, at connect).
    pub gid: u32,
}

/// Who the operator is on this host.
#[derive(Clone, Debug)]
pub struct Operators {
    /// fleetd's own uid.
    pub me: u32,
    /// The operator group's name, if one is configured.
    pub group: Option<String>,
}

impl Operators {
    /// What `peer` is.
    pub fn class(&self, peer: Peer) -> PeerClass {
        if peer.uid == 0 || peer.uid == self.me {
            return PeerClass::Operator;
        }
        let Some(group) = &self.group else {
            return PeerClass::Other;
        };
        match std::fs::read_to_string(Path::new(GROUP_FILE)) {
            Ok(text) if member(&text, group, peer) => PeerClass::Operator,
            // Unreadable or absent: nobody else is the operator (fail closed).
            _ => PeerClass::Other,
        }
    }

    /// Who may use the operator's API, for refusals.
    pub fn describe(&self) -> String {
        match &self.group {
            Some(group) => format!("root, fleetd's own user or a member of group `{group}`"),
            None => "root or fleetd's own user".to_owned(),
        }
    }
}

/// Whether `peer` is in `group` according to the `/etc/group` text `groups`: its gid is the
/// group's, or its user name is listed as a member (the name from `/etc/passwd`).
fn member(groups: &str, group: &str, peer: Peer) -> bool {
    let Some((gid, members)) = groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let gid: u32 = fields.next()?.parse().ok()?;
        let members = fields.next().unwrap_or("");
        (name == group).then(|| (gid, members.to_owned()))
    }) else {
        return false;
    };
    if peer.gid == gid {
        return true;
    }
    let Some(name) = user_name(peer.uid) else {
        return false;
    };
    members.split(',').any(|m| m.trim() == name)
}

/// The name of user `uid` in `/etc/passwd`.
fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let id: u32 = fields.next()?.parse().ok()?;
        (id == uid).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_is_by_gid_or_by_the_member_list_and_nothing_else() {
        let groups = "root:x:0:\nops:x:1500:alice,carol\nopsx:x:1501:bob\n";
        let peer = |uid, gid| Peer { uid, gid };
        assert!(member(groups, "ops", peer(4242, 1500)), "primary group");
        assert!(
            !member(groups, "ops", peer(4242, 1501)),
            "another group's gid"
        );
        assert!(!member(groups, "nope", peer(4242, 1500)), "an absent group");
        assert!(
            !member(groups, "op", peer(4242, 1500)),
            "a prefix is not the group"
        );
        // Root's name is listed nowhere here, and uid 0 is not looked up by gid.
        assert!(!member(groups, "ops", peer(0, 0)));
    }

    #[test]
    fn root_and_fleetds_user_are_the_operator_and_others_need_a_token() {
        let operators = Operators {
            me: 990,
            group: None,
        };
        let class = |uid| operators.class(Peer { uid, gid: uid });
        assert_eq!(class(0), PeerClass::Operator);
        assert_eq!(class(990), PeerClass::Operator);
        assert_eq!(class(1000), PeerClass::Other);
        assert_eq!(class(65534), PeerClass::Other);
    }
}
