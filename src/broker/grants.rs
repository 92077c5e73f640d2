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
/// The fleet's own exchanges and their types, declared by the admin.
pub const FLEET_EXCHANGES: [(&str, &str); 3] = [
    (super::topology::INBOX_EXCHANGE, "direct"),
    (super::topology::CTL_EXCHANGE, "direct"),
    (super::topology::ROSTER_EXCHANGE, "topic"),
];

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

/// The broker user of host `host` of fleet `fleet`: `FLEET.HOST` (a fleet name has no dot, so
/// the first dot splits it).
pub fn host_user(fleet: &str, host: &str) -> String {
    format!("{fleet}.{host}")
}

/// The fleet and host a host user `FLEET.HOST` names; `None` for a fleet user (no dot).
pub fn split_host_user(user: &str) -> Option<(&str, &str)> {
    user.split_once('.').filter(|(_, host)| !host.is_empty())
}

/// Host `host`'s own queues: its control and roster queues and its agents' inboxes.
fn host_queues(host: &str) -> String {
    let h = regex_escape(host);
    format!(r"gw\.{h}\.(ctl|roster)|agent\.{h}\.[^.]+\.inbox")
}

/// A host user's permissions on its fleet's vhost: configure its own queues only (the fleet's
/// exchanges are the admin's); write the fleet's exchanges (to send and to bind) and its own
/// queues; read those, its own queues and the ingress exchanges (to bind). Never another host's
/// queues: it can neither declare, bind, purge, delete nor consume them.
pub fn host_permissions(host: &str) -> Permissions {
    let own = host_queues(host);
    Permissions {
        configure: format!("^({own})$"),
        write: format!(r"^(fleet\.(inbox|ctl)|roster|{own})$"),
        read: format!(r"^(fleet\.(inbox|ctl)|roster|x\.in\..+|{own})$"),
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
    /// LavinMQ's `lavinmqctl`; the user (whose password `lavinmqctl add_user` would take on its
    /// command line) and revocation through LavinMQ's control socket with curl.
    Lavinmqctl,
}

/// LavinMQ 2.9's control socket (`INTERNAL_UNIX_SOCKET`, src/lavinmq/http/constants.cr): HTTP
/// requests on it run as LavinMQ's internal administrator, so no admin password is needed —
/// only the right to open it (root or the LavinMQ user), as for `lavinmqctl` itself.
pub const LAVINMQ_SOCKET: &str = "/tmp/lavinmqctl.sock";

/// The commands that set up `fleet`, admitting `admits`, as a shell script to review and run.
pub fn script(fleet: &str, admits: &[String], tool: Tool) -> String {
    let vhost = vhost(fleet);
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
    if tool == Tool::Lavinmqctl {
        line(
            "# as root or the LavinMQ user: lavinmqctl and curl talk to LavinMQ's control socket"
                .to_owned(),
        );
        line(format!(
            "sock={LAVINMQ_SOCKET}   # a build with an abstract socket (@{LAVINMQ_SOCKET}): curl --abstract-unix-socket"
        ));
    }
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
            // `lavinmqctl add_user NAME PASSWORD` takes the password as an argument: the user is
            // made over the socket instead, its JSON read from a file.
            line("# no tags; the password arrives as JSON on stdin, never on a command line: {\"password\":\"…\",\"tags\":\"\"}".to_owned());
            line(format!(
                "curl -fsS --unix-socket \"$sock\" -H 'content-type: application/json' -X PUT --data-binary @- http://localhost/api/users/{fleet} < /path/to/{fleet}.user.json"
            ));
        }
    }
    line(set_permissions(ctl, &vhost, fleet, &own_permissions()));
    line(
        "# the fleet's exchanges, declared by the admin (host users may not configure them)"
            .to_owned(),
    );
    for (name, kind) in FLEET_EXCHANGES {
        line(match tool {
            Tool::Rabbitmqctl => format!(
                "rabbitmqadmin --vhost={} declare exchange name={name} type={kind} durable=true   # or: fleetd broker grants --apply",
                quote(&vhost)
            ),
            Tool::Lavinmqctl => format!(
                "lavinmqctl create_exchange -p {} --durable {kind} {name}",
                quote(&vhost)
            ),
        });
    }
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
                "lavinmqctl create_exchange -p {} --durable topic {exchange}",
                quote(&vhost)
            ),
        });
        line(set_permissions(
            ctl,
            &vhost,
            origin,
            &admitted_permissions(origin),
        ));
        line(match tool {
            Tool::Rabbitmqctl => format!(
                "# to revoke {origin} later: rabbitmqctl clear_permissions -p {} {}",
                quote(&vhost),
                quote(origin)
            ),
            // lavinmqctl has no clear_permissions.
            Tool::Lavinmqctl => format!(
                "# to revoke {origin} later: curl -fsS --unix-socket \"$sock\" -X DELETE http://localhost/api/permissions/%2F{fleet}/{origin}"
            ),
        });
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

/// The commands that create host `host`'s user `FLEET.HOST` in `fleet` (whose grants, run
/// first, made the vhost and its exchanges), writing into the ingress exchanges of the fleets in
/// `into` (which admit `fleet`), as a shell script to review and run.
pub fn host_script(fleet: &str, host: &str, into: &[String], tool: Tool) -> String {
    let own_vhost = vhost(fleet);
    let user = host_user(fleet, host);
    let ctl = match tool {
        Tool::Rabbitmqctl => "rabbitmqctl",
        Tool::Lavinmqctl => "lavinmqctl",
    };
    let mut out = format!(
        "# host `{host}` of fleet `{fleet}`: user {user} without tags; its own queues only in {own_vhost}\n"
    );
    match tool {
        Tool::Rabbitmqctl => {
            out.push_str("# reads the password from stdin; never put it on a command line\n");
            out.push_str(&format!(
                "rabbitmqctl add_user {} < /path/to/{user}.password\nrabbitmqctl set_user_tags {}\n",
                quote(&user),
                quote(&user)
            ));
        }
        Tool::Lavinmqctl => {
            out.push_str(&format!(
                "sock={LAVINMQ_SOCKET}\n# no tags; the password arrives as JSON on stdin: {{\"password\":\"…\",\"tags\":\"\"}}\n\
                 curl -fsS --unix-socket \"$sock\" -H 'content-type: application/json' -X PUT --data-binary @- http://localhost/api/users/{user} < /path/to/{user}.user.json\n"
            ));
        }
    }
    out.push_str(&set_permissions(
        ctl,
        &own_vhost,
        &user,
        &host_permissions(host),
    ));
    out.push('\n');
    for target in into {
        out.push_str(&format!(
            "# into fleet `{target}` (its grants admit `{fleet}`): write on x.in.{fleet} only\n"
        ));
        out.push_str(&set_permissions(
            ctl,
            &vhost(target),
            &user,
            &admitted_permissions(fleet),
        ));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_user_reaches_its_own_queues_and_the_fleet_exchanges_only() {
        let p = host_permissions("w1.lab");
        let configure = regex::Regex::new(&p.configure).unwrap();
        let write = regex::Regex::new(&p.write).unwrap();
        let read = regex::Regex::new(&p.read).unwrap();
        for own in [
            "gw.w1.lab.ctl",
            "gw.w1.lab.roster",
            "agent.w1.lab.0190-ab.inbox",
        ] {
            assert!(
                configure.is_match(own) && write.is_match(own) && read.is_match(own),
                "{own}"
            );
        }
        for sibling in [
            "gw.w2.ctl",
            "gw.w1.ctl",
            "gw.w1xlab.ctl",
            "agent.w2.0190-ab.inbox",
            "agent.w1.lab.x.0190.inbox",
            "agent.0190-ab.inbox",
            "gw.w1.lab.ctl.x",
        ] {
            assert!(
                !configure.is_match(sibling) && !write.is_match(sibling) && !read.is_match(sibling),
                "{sibling}"
            );
        }
        for exchange in ["fleet.inbox", "fleet.ctl", "roster"] {
            assert!(!configure.is_match(exchange), "the admin's: {exchange}");
            assert!(
                write.is_match(exchange) && read.is_match(exchange),
                "{exchange}"
            );
        }
        assert!(read.is_match("x.in.mac") && !write.is_match("x.in.mac"));
        assert_eq!(host_user("fleet01", "w1.lab"), "fleet01.w1.lab");
        assert_eq!(
            split_host_user("fleet01.w1.lab"),
            Some(("fleet01", "w1.lab"))
        );
        assert_eq!(split_host_user("fleet01"), None);
        let script = host_script("fleet01", "w1.lab", &["mac".to_owned()], Tool::Rabbitmqctl);
        assert!(script.contains(r"set_permissions -p /fleet01 fleet01.w1.lab '^(gw\.w1\.lab\.(ctl|roster)|agent\.w1\.lab\.[^.]+\.inbox)$'"), "{script}");
        assert!(
            script.contains(r"set_permissions -p /mac fleet01.w1.lab '^$' '^x\.in\.fleet01$' '^$'"),
            "{script}"
        );
    }

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

    /// Splits a shell line into words (single and double quotes; an unquoted `#` starts a
    /// comment, `<` a redirection: both end the words).
    fn words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    any = true;
                }
                (None, '#' | '<') if word.is_empty() => break,
                (None, ' ') => {
                    if any || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                (None, c) => word.push(c),
            }
        }
        if any || !word.is_empty() {
            words.push(word);
        }
        words
    }

    /// lavinmqctl 2.9's grammar for the commands the script uses (src/lavinmqctl/cli.cr:
    /// COMPAT_CMDS, `create_exchange`'s parser, and the `-p` global option): the command, its
    /// positional arguments, the flags it takes. `add_user` and `change_password` are absent on
    /// purpose: they take the password as an argument.
    const LAVINMQCTL: [(&str, usize, &[&str]); 3] = [
        ("add_vhost", 1, &[]),
        ("set_permissions", 4, &["-p"]),
        ("create_exchange", 2, &["-p", "--durable"]),
    ];

    #[test]
    fn the_lavinmq_script_follows_lavinmqctl_and_the_control_socket_api() {
        let text = script("f1", &["f2".to_owned(), "f3".to_owned()], Tool::Lavinmqctl);
        let mut seen = Vec::new();
        for line in text.lines() {
            let words = words(line);
            let Some(program) = words.first() else {
                continue;
            };
            match program.as_str() {
                "lavinmqctl" => {
                    let command = &words[1];
                    let (_, positionals, flags) = LAVINMQCTL
                        .iter()
                        .find(|(name, ..)| name == command)
                        .unwrap_or_else(|| panic!("not a lavinmqctl command here: {line}"));
                    let mut rest = words[2..].iter();
                    let mut args = Vec::new();
                    while let Some(word) = rest.next() {
                        if word.starts_with('-') {
                            assert!(flags.contains(&word.as_str()), "{word} in {line}");
                            if word == "-p" {
                                assert!(rest.next().is_some_and(|v| v == "/f1"), "{line}");
                            }
                        } else {
                            args.push(word.as_str());
                        }
                    }
                    assert_eq!(args.len(), *positionals, "{line}");
                    if command == "create_exchange" {
                        let expected = FLEET_EXCHANGES
                            .iter()
                            .find(|(name, _)| *name == args[1])
                            .map_or("topic", |(_, kind)| kind);
                        assert_eq!(args[0], expected, "type first, then the name: {line}");
                        assert!(
                            args[1].starts_with("x.in.f")
                                || expected != "topic"
                                || args[1] == "roster",
                            "{line}"
                        );
                        assert!(words.contains(&"--durable".to_owned()), "{line}");
                    }
                    seen.push(command.clone());
                }
                "curl" => {
                    let at = words.iter().position(|w| w == "--unix-socket").unwrap();
                    assert_eq!(words[at + 1], "$sock", "over the control socket: {line}");
                    assert!(
                        !words.contains(&"-u".to_owned()),
                        "no admin password: {line}"
                    );
                    assert_eq!(words[words.len() - 1], "http://localhost/api/users/f1");
                    assert!(
                        line.contains("--data-binary @- ")
                            && line.ends_with("< /path/to/f1.user.json")
                    );
                    seen.push("user".to_owned());
                }
                "sock=/tmp/lavinmqctl.sock" => {}
                other => panic!("unexpected command `{other}`: {line}"),
            }
        }
        assert_eq!(
            seen,
            [
                "add_vhost",
                "user",
                "set_permissions",
                "create_exchange",
                "create_exchange",
                "create_exchange",
                "create_exchange",
                "set_permissions",
                "create_exchange",
                "set_permissions"
            ]
        );
        // Revocation: lavinmqctl has no clear_permissions; the HTTP DELETE of each grant.
        for origin in ["f2", "f3"] {
            let revoke = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# to revoke {origin} later: ")))
                .unwrap();
            let words = words(revoke);
            assert_eq!(
                words,
                [
                    "curl",
                    "-fsS",
                    "--unix-socket",
                    "$sock",
                    "-X",
                    "DELETE",
                    &format!("http://localhost/api/permissions/%2Ff1/{origin}")
                ]
            );
        }
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
