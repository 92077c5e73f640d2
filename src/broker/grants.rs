//! Least-privilege broker grants for one fleet: its vhost, its user (no tags), its permissions,
//! and for each admitted origin fleet an ingress exchange that origin may only write to.
//!
//! | user → vhost | configure | write | read |
//! |---|---|---|---|
//! | `F` → `/F` | own objects | own objects — never `x.in.*`, never the default exchange | own objects + `x.in.*` |
//! | `O` → `/F` (admitted) | `^$` | `^x\.in\.O$` | `^$` |
//!
//! Both brokers match these regexes unanchored, so each is anchored here. The password is never
//! on a command line: `rabbitmqctl add_user NAME` reads it from stdin.

use super::topology::ingress_exchange;

/// Objects a fleet's own user may configure and write: its exchanges, inboxes and gateway queues.
pub const OWN_OBJECTS: &str = r"^(fleet\.(inbox|ctl)|roster|agent\..+\.inbox|gw\..+)$";
/// What a fleet's own user may read: its objects and every ingress exchange (to bind it).
pub const OWN_READ: &str = r"^(fleet\.(inbox|ctl)|roster|agent\..+\.inbox|gw\..+|x\.in\..+)$";
/// Deny-all pattern.
pub const NOTHING: &str = "^$";

/// The three permission patterns of one user on one vhost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    /// configure
    pub configure: String,
    /// write
    pub write: String,
    /// read
    pub read: String,
}

/// The own fleet's permissions on its vhost.
pub fn own_permissions() -> Permissions {
    Permissions {
        configure: OWN_OBJECTS.to_owned(),
        write: OWN_OBJECTS.to_owned(),
        read: OWN_READ.to_owned(),
    }
}

/// An admitted origin's permissions on the fleet's vhost: write on its ingress exchange only.
pub fn admitted_permissions(origin: &str) -> Permissions {
    Permissions {
        configure: NOTHING.to_owned(),
        write: format!("^{}$", regex_escape(&ingress_exchange(origin))),
        read: NOTHING.to_owned(),
    }
}

/// The vhost of fleet `fleet`.
pub fn vhost(fleet: &str) -> String {
    format!("/{fleet}")
}

/// Which broker CLI the printed commands are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// RabbitMQ's `rabbitmqctl` (exchanges through `rabbitmqadmin` or `--apply`).
    Rabbitmqctl,
    /// LavinMQ's `lavinmqctl` (user and exchanges through its HTTP API with curl).
    Lavinmqctl,
}

/// The commands that set up `fleet`, admitting `admits`, as a shell script to review and run.
pub fn script(fleet: &str, admits: &[String], tool: Tool) -> String {
    let vhost = vhost(fleet);
    let api = "http://localhost:15672/api";
    let ctl = match tool {
        Tool::Rabbitmqctl => "rabbitmqctl",
        Tool::Lavinmqctl => "lavinmqctl",
    };
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "# fleet `{fleet}`: vhost {vhost}, user {fleet} without tags, least-privilege permissions"
    ));
    line(format!("{ctl} add_vhost {}", quote(&vhost)));
    match tool {
        Tool::Rabbitmqctl => {
            line("# reads the password from stdin; never put it on a command line".to_owned());
            line(format!(
                "rabbitmqctl add_user {} < /path/to/{fleet}.password",
                quote(fleet)
            ));
            line(format!("rabbitmqctl set_user_tags {}", quote(fleet)));
        }
        Tool::Lavinmqctl => {
            line("# the password arrives on stdin as JSON, never on a command line: {\"password\":\"…\",\"tags\":\"\"}".to_owned());
            line(format!(
                "curl -fsS -u admin -H 'content-type: application/json' -X PUT --data-binary @- {api}/users/{fleet} < /path/to/{fleet}.user.json"
            ));
        }
    }
    line(set_permissions(ctl, &vhost, fleet, &own_permissions()));
    for origin in admits {
        let exchange = ingress_exchange(origin);
        line(format!(
            "# admit fleet `{origin}`: an ingress exchange only the admin declares, write-only for {origin}"
        ));
        line(match tool {
            Tool::Rabbitmqctl => format!(
                "rabbitmqadmin --vhost={} declare exchange name={exchange} type=topic durable=true   # or: fleetd broker grants --apply",
                quote(&vhost)
            ),
            Tool::Lavinmqctl => format!(
                "curl -fsS -u admin -H 'content-type: application/json' -X PUT -d '{{\"type\":\"topic\",\"durable\":true}}' {api}/exchanges/%2F{fleet}/{exchange}"
            ),
        });
        line(set_permissions(
            ctl,
            &vhost,
            origin,
            &admitted_permissions(origin),
        ));
    }
    out
}

fn set_permissions(ctl: &str, vhost: &str, user: &str, p: &Permissions) -> String {
    format!(
        "{ctl} set_permissions -p {} {} {} {} {}",
        quote(vhost),
        quote(user),
        quote(&p.configure),
        quote(&p.write),
        quote(&p.read)
    )
}

/// Single-quotes `text` for a POSIX shell.
fn quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Escapes regex metacharacters in a name.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_fleet_may_only_write_its_ingress_exchange() {
        let p = admitted_permissions("mac");
        assert_eq!(
            (p.configure.as_str(), p.write.as_str(), p.read.as_str()),
            ("^$", r"^x\.in\.mac$", "^$")
        );
    }

    #[test]
    fn own_permissions_never_cover_ingress_or_the_default_exchange() {
        let own = regex::Regex::new(OWN_OBJECTS).unwrap();
        let read = regex::Regex::new(OWN_READ).unwrap();
        for denied in [
            "x.in.mac",
            "",
            "amq.default",
            "amq.topic",
            "other",
            "agent.x.inboxes",
        ] {
            assert!(
                !own.is_match(denied),
                "write/configure must not match `{denied}`"
            );
        }
        for allowed in [
            "fleet.inbox",
            "fleet.ctl",
            "roster",
            "agent.0190-ab.inbox",
            "gw.laptop.ctl",
            "gw.laptop.roster",
        ] {
            assert!(own.is_match(allowed), "{allowed}");
        }
        assert!(read.is_match("x.in.mac") && !read.is_match(""));
    }

    #[test]
    fn script_never_holds_a_password_and_quotes_patterns() {
        for tool in [Tool::Rabbitmqctl, Tool::Lavinmqctl] {
            let text = script("fleet01", &["mac".to_owned()], tool);
            assert!(text.contains(r"'^x\.in\.mac$'"), "{text}");
            assert!(
                text.contains("set_permissions -p /fleet01 fleet01"),
                "{text}"
            );
            assert!(
                !text.to_lowercase().contains("password\":\"") || text.contains("…"),
                "{text}"
            );
        }
    }
}
