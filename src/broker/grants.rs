//! Least-privilege broker grants for one fleet: its vhost, its exchanges (the admin's), a user
//! per host, and for each admitted origin fleet an ingress exchange that origin may only write
//! to.
//!
//! | user → vhost | configure | write | read |
//! |---|---|---|---|
//! | `F.H` → `/F` (host `H`) | `H`'s queues | `fleet.send`, `roster`, `H`'s queues | `roster`, `host.H`, `H`'s queues |
//! | `F` → `/F` (shared, every host) | the fleet's objects | the same | the same |
//! | `O` → `/F` (admitted) | `^$` | `^x\.in\.O$` | `^$` |
//!
//! A host publishes into `fleet.send`, which no host may read: only the admin binds it, to each
//! host's `host.H` with that host's keys. Binding a queue needs read on the exchange, so a host
//! can bind its queues to `host.H` alone and never receive a copy of what is addressed to
//! another host. Both brokers match these regexes unanchored, so each is anchored here. The
//! password is never on a command line: `rabbitmqctl add_user NAME` reads it from stdin.

use super::topology::{
    INGRESS_BINDINGS, ROSTER_EXCHANGE, SEND_EXCHANGE, host_binding_keys, host_exchange,
    ingress_exchange,
};

/// Objects a shared fleet user may configure, write and read: the fleet's exchanges, every
/// host's exchange and queues — never `x.in.*`, never the default exchange.
pub const OWN_OBJECTS: &str = r"^(fleet\.send|roster|host\..+|agent\..+\.inbox|gw\..+)$";
/// The fleet's own exchanges, declared by the admin; every exchange of the topology is a topic
/// exchange.
pub const FLEET_EXCHANGES: [&str; 2] = [SEND_EXCHANGE, ROSTER_EXCHANGE];

/// Deny-all pattern.
pub const NOTHING: &str = "^$";

/// Configure, write and read on exactly the objects `names` (anchored, escaped): what the admin
/// holds while it declares and binds the topology's exchanges, and loses afterwards.
pub fn exactly(names: &[&str]) -> Permissions {
    let mut names = names.to_vec();
    names.sort_unstable();
    names.dedup();
    let pattern = format!(
        "^({})$",
        names
            .iter()
            .map(|n| regex_escape(n))
            .collect::<Vec<_>>()
            .join("|")
    );
    Permissions {
        configure: pattern.clone(),
        write: pattern.clone(),
        read: pattern,
    }
}

/// The printed RabbitMQ script's administrator: rabbitmqadmin logs in as it, and RabbitMQ gives
/// nobody rights on a vhost `rabbitmqctl add_vhost` made, so it is granted exactly the exchanges
/// it declares and binds, and cleared at the end (as `--apply` does).
const ADMIN_LINE: &str = "admin=\"${RABBITMQADMIN_USER:-guest}\"   # the administrator rabbitmqadmin logs in as (its ~/.rabbitmqadmin.conf or -u): rights on exactly these exchanges while they are declared, none after";

/// The lines granting the printed script's admin (see [`ADMIN_LINE`]) `names` in `vhost`.
fn admin_grant(vhost: &str, names: &[&str]) -> String {
    let p = exactly(names);
    format!(
        "{ADMIN_LINE}\nrabbitmqctl set_permissions -p {} \"$admin\" {} {} {}",
        quote(vhost),
        quote(&p.configure),
        quote(&p.write),
        quote(&p.read)
    )
}

/// The line taking the admin's rights on `vhost` away again.
fn admin_clear(vhost: &str) -> String {
    format!(
        "rabbitmqctl clear_permissions -p {} \"$admin\"",
        quote(vhost)
    )
}

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

/// A shared fleet user's permissions on its vhost: every host's objects, no isolation between
/// the hosts that share it.
pub fn own_permissions() -> Permissions {
    Permissions {
        configure: OWN_OBJECTS.to_owned(),
        write: OWN_OBJECTS.to_owned(),
        read: OWN_OBJECTS.to_owned(),
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

/// A host user's permissions on its fleet's vhost: configure its own queues only (every
/// exchange is the admin's); write `fleet.send` and `roster` (to send) and its own queues (to
/// bind them); read `roster` and its own `host.H` (to bind from them) and its own queues. Never
/// another host's queues or exchange, never `fleet.send` or an ingress exchange: it can neither
/// consume another host's queues nor bind its own where another host's traffic passes.
pub fn host_permissions(host: &str) -> Permissions {
    let own = host_queues(host);
    let exchange = regex_escape(&host_exchange(host));
    Permissions {
        configure: format!("^({own})$"),
        write: format!(r"^(fleet\.send|roster|{own})$"),
        read: format!(r"^(roster|{exchange}|{own})$"),
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

/// Where a new user's password is read from in a printed script: the file given
/// (`--password-file`), else a placeholder path for the operator to replace.
fn password_source(given: Option<&str>, user: &str) -> String {
    given.map_or_else(|| format!("/path/to/{user}.password"), quote)
}

/// The commands that set up `fleet`, admitting `admits` (with `shared`, also the shared fleet
/// user `FLEET`, its password read from `password_file` when given), as a shell script to
/// review and run. Every value in it is printed as it is to be run (names, keys, patterns);
/// no password is ever in it.
pub fn script(
    fleet: &str,
    admits: &[String],
    (shared, password_file): (bool, Option<&str>),
    tool: Tool,
) -> String {
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
        "# fleet `{fleet}`: vhost {vhost} and its exchanges; each host's user comes from `fleetd broker grants --fleet {fleet} --host HOST`"
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
    if shared {
        line(format!(
            "# the shared user {fleet}, without tags: it reaches every host's queues and traffic (hosts sharing it are not isolated)"
        ));
        match tool {
            Tool::Rabbitmqctl => {
                line("# reads the password from stdin; never put it on a command line".to_owned());
                line(format!(
                    "rabbitmqctl add_user {} < {}",
                    quote(fleet),
                    password_source(password_file, fleet)
                ));
                line(format!("rabbitmqctl set_user_tags {}", quote(fleet)));
            }
            Tool::Lavinmqctl => {
                // `lavinmqctl add_user NAME PASSWORD` takes the password as an argument: the user
                // is made over the socket instead, its JSON read from a file.
                line("# no tags; the password arrives as JSON on stdin, never on a command line: {\"password\":\"…\",\"tags\":\"\"}".to_owned());
                line(format!(
                    "curl -fsS --unix-socket \"$sock\" -H 'content-type: application/json' -X PUT --data-binary @- http://localhost/api/users/{fleet} < /path/to/{fleet}.user.json"
                ));
            }
        }
        line(set_permissions(ctl, &vhost, fleet, &own_permissions()));
    }
    line(
        "# the fleet's exchanges, declared by the admin (host users may not configure them)"
            .to_owned(),
    );
    let ingress: Vec<String> = admits.iter().map(|o| ingress_exchange(o)).collect();
    if tool == Tool::Rabbitmqctl {
        let mut names: Vec<&str> = FLEET_EXCHANGES.to_vec();
        names.extend(ingress.iter().map(String::as_str));
        line(admin_grant(&vhost, &names));
    }
    for name in FLEET_EXCHANGES {
        line(declare_exchange(tool, fleet, name));
    }
    for origin in admits {
        let exchange = ingress_exchange(origin);
        line(format!(
            "# admit fleet `{origin}`: an ingress exchange only the admin declares and binds, write-only for {origin}"
        ));
        line(declare_exchange(tool, fleet, &exchange));
        for (destination, key) in INGRESS_BINDINGS {
            line(bind_exchange(tool, fleet, (&exchange, destination), key));
        }
        if shared {
            line(set_permissions(
                ctl,
                &vhost,
                origin,
                &admitted_permissions(origin),
            ));
        }
        line(format!(
            "# each host of {origin} gets write on {exchange} from: fleetd broker grants --fleet {origin} --host HOST --into {fleet}"
        ));
        let each = if shared {
            format!("for each host HOST of {origin}, and for {origin} itself")
        } else {
            format!("for each host HOST of {origin}")
        };
        line(match tool {
            Tool::Rabbitmqctl => format!(
                "# to revoke {origin} later: rabbitmqctl clear_permissions -p {} {origin}.HOST   # {each}",
                quote(&vhost),
            ),
            // lavinmqctl has no clear_permissions.
            Tool::Lavinmqctl => format!(
                "# to revoke {origin} later: curl -fsS --unix-socket \"$sock\" -X DELETE http://localhost/api/permissions/%2F{fleet}/{origin}.HOST   # {each}"
            ),
        });
    }
    if tool == Tool::Rabbitmqctl {
        line(admin_clear(&vhost));
    }
    out
}

/// The admin's command that declares the topic exchange `name` in `/fleet`.
fn declare_exchange(tool: Tool, fleet: &str, name: &str) -> String {
    let vhost = quote(&vhost(fleet));
    match tool {
        Tool::Rabbitmqctl => format!(
            "rabbitmqadmin --vhost={vhost} declare exchange name={name} type=topic durable=true   # or: fleetd broker grants --apply"
        ),
        Tool::Lavinmqctl => {
            format!("lavinmqctl create_exchange -p {vhost} --durable topic {name}")
        }
    }
}

/// The admin's command that binds exchange `destination` to `source` with `key` in `/fleet`.
fn bind_exchange(
    tool: Tool,
    fleet: &str,
    (source, destination): (&str, &str),
    key: &str,
) -> String {
    match tool {
        Tool::Rabbitmqctl => format!(
            "rabbitmqadmin --vhost={} declare binding source={source} destination={destination} destination_type=exchange routing_key={}   # or: fleetd broker grants --apply",
            quote(&vhost(fleet)),
            quote(key)
        ),
        // lavinmqctl has no bind command: the control socket's HTTP API.
        Tool::Lavinmqctl => format!(
            "curl -fsS --unix-socket \"$sock\" -H 'content-type: application/json' -X POST --data '{{\"routing_key\":\"{key}\"}}' http://localhost/api/bindings/%2F{fleet}/e/{source}/e/{destination}"
        ),
    }
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
pub(super) fn regex_escape(text: &str) -> String {
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
/// `into` (which admit `fleet`), as a shell script to review and run; with RabbitMQ the
/// password is read from `password_file` when given.
pub fn host_script(
    (fleet, host): (&str, &str),
    into: &[String],
    tool: Tool,
    password_file: Option<&str>,
) -> String {
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
                "rabbitmqctl add_user {} < {}\nrabbitmqctl set_user_tags {}\n",
                quote(&user),
                password_source(password_file, &user),
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
    let exchange = host_exchange(host);
    out.push_str(&format!(
        "# the admin: host `{host}`'s own exchange, bound from fleet.send with its keys only\n"
    ));
    if tool == Tool::Rabbitmqctl {
        out.push_str(&admin_grant(&own_vhost, &[SEND_EXCHANGE, &exchange]));
        out.push('\n');
    }
    out.push_str(&declare_exchange(tool, fleet, &exchange));
    out.push('\n');
    for key in host_binding_keys(host) {
        out.push_str(&bind_exchange(
            tool,
            fleet,
            (SEND_EXCHANGE, &exchange),
            &key,
        ));
        out.push('\n');
    }
    if tool == Tool::Rabbitmqctl {
        out.push_str(&admin_clear(&own_vhost));
        out.push('\n');
    }
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
        // It sends into the fleet's exchanges but may bind only from its own: never from
        // `fleet.send`, another host's exchange or an ingress exchange.
        for exchange in ["fleet.send", "roster"] {
            assert!(
                !configure.is_match(exchange) && write.is_match(exchange),
                "{exchange}"
            );
        }
        assert!(read.is_match("roster") && read.is_match("host.w1.lab"));
        for foreign in [
            "fleet.send",
            "host.w1",
            "host.w1.lab.x",
            "host.w1xlab",
            "host.w2",
            "x.in.mac",
        ] {
            assert!(
                !configure.is_match(foreign) && !read.is_match(foreign),
                "{foreign}"
            );
        }
        assert!(!write.is_match("x.in.mac") && !write.is_match("host.w1.lab"));
        assert_eq!(host_user("fleet01", "w1.lab"), "fleet01.w1.lab");
        assert_eq!(
            split_host_user("fleet01.w1.lab"),
            Some(("fleet01", "w1.lab"))
        );
        assert_eq!(split_host_user("fleet01"), None);
        let script = host_script(
            ("fleet01", "w1.lab"),
            &["mac".to_owned()],
            Tool::Rabbitmqctl,
            None,
        );
        assert!(script.contains(r"set_permissions -p /fleet01 fleet01.w1.lab '^(gw\.w1\.lab\.(ctl|roster)|agent\.w1\.lab\.[^.]+\.inbox)$'"), "{script}");
        assert!(
            script.contains(r"set_permissions -p /mac fleet01.w1.lab '^$' '^x\.in\.fleet01$' '^$'"),
            "{script}"
        );
        for line in [
            "rabbitmqadmin --vhost=/fleet01 declare exchange name=host.w1.lab type=topic durable=true",
            "declare binding source=fleet.send destination=host.w1.lab destination_type=exchange routing_key=ctl.w1.lab ",
            "declare binding source=fleet.send destination=host.w1.lab destination_type=exchange routing_key='agent.w1.lab.*' ",
        ] {
            assert!(script.contains(line), "{line} in {script}");
        }
        let lavin = host_script(("fleet01", "w1.lab"), &[], Tool::Lavinmqctl, None);
        for line in [
            "lavinmqctl create_exchange -p /fleet01 --durable topic host.w1.lab",
            r#"--data '{"routing_key":"ctl.w1.lab"}' http://localhost/api/bindings/%2Ffleet01/e/fleet.send/e/host.w1.lab"#,
            r#"--data '{"routing_key":"agent.w1.lab.*"}' http://localhost/api/bindings/%2Ffleet01/e/fleet.send/e/host.w1.lab"#,
        ] {
            assert!(lavin.contains(line), "{line} in {lavin}");
        }
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
    fn shared_fleet_users_never_cover_ingress_or_the_default_exchange() {
        let own = regex::Regex::new(OWN_OBJECTS).unwrap();
        for denied in [
            "x.in.mac",
            "",
            "amq.default",
            "amq.topic",
            "other",
            "agent.x.inboxes",
            "fleet.inbox",
        ] {
            assert!(!own.is_match(denied), "must not match `{denied}`");
        }
        for allowed in [
            "fleet.send",
            "roster",
            "host.laptop",
            "agent.laptop.0190-ab.inbox",
            "gw.laptop.ctl",
            "gw.laptop.roster",
        ] {
            assert!(own.is_match(allowed), "{allowed}");
        }
    }

    #[test]
    fn host_binding_keys_match_no_other_hosts_keys() {
        // Topic semantics: `*` is one word, `#` any number; keys split on dots.
        fn matches(pattern: &str, key: &str) -> bool {
            fn go(p: &[&str], k: &[&str]) -> bool {
                match (p.split_first(), k.split_first()) {
                    (None, None) => true,
                    (Some((&"#", rest)), _) => {
                        go(rest, k) || k.split_first().is_some_and(|(_, kr)| go(p, kr))
                    }
                    (Some((&"*", pr)), Some((_, kr))) => go(pr, kr),
                    (Some((pw, pr)), Some((kw, kr))) => pw == kw && go(pr, kr),
                    _ => false,
                }
            }
            go(
                &pattern.split('.').collect::<Vec<_>>(),
                &key.split('.').collect::<Vec<_>>(),
            )
        }
        let hosts = ["w1", "w1.lab", "lab", "w1.lab.x", "ctl", "agent"];
        let id = "0190ab12-0000-7000-8000-000000000001";
        for owner in hosts {
            let keys = [
                super::super::topology::control_key(owner),
                super::super::topology::agent_key(owner, id),
            ];
            for host in hosts {
                for key in &keys {
                    let hit = host_binding_keys(host).iter().any(|p| matches(p, key));
                    assert_eq!(hit, host == owner, "host {host}'s keys vs {key}");
                }
            }
            // Unknown host: `agent.ID` reaches nobody.
            for pattern in host_binding_keys(owner) {
                assert!(!matches(&pattern, &format!("agent.{id}")), "{pattern}");
            }
        }
        // An ingress exchange routes control messages and beats only.
        assert!(matches(INGRESS_BINDINGS[0].1, "ctl.w1.lab"));
        assert!(!matches(INGRESS_BINDINGS[0].1, &format!("agent.w1.{id}")));
        assert!(matches(INGRESS_BINDINGS[1].1, "roster.w1"));
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

    /// Checks a printed LavinMQ script line by line against LavinMQ 2.9's grammar, as the
    /// operator reads it (through the scrubber, as `fleetd broker grants` prints): lavinmqctl
    /// commands by [`LAVINMQCTL`]; curl over the control socket (`http/constants.cr`, run as
    /// `__direct`: `http/handler/auth_handler.cr:12-15`), with bindings as
    /// `BindingsController`'s `POST /api/bindings/:vhost/e/:name/e/:destination`, whose JSON
    /// body's `routing_key` is bound verbatim (`http/controller/bindings.cr:128-155` at
    /// cloudamqp/lavinmq 063760a: `body["routing_key"]` then `bind_exchange`), and users as
    /// `PUT /api/users/:name` with the JSON on stdin (`users.cr:74-113`). `binds(source,
    /// destination, key)`: whether the script may bind that. Returns the commands in order.
    fn lavinmq_commands(text: &str, binds: impl Fn(&str, &str, &str) -> bool) -> Vec<String> {
        let scrubber = crate::scrub::Scrubber::new();
        let mut seen = Vec::new();
        for line in text.lines() {
            assert_eq!(scrubber.scrub(line), line, "printed as it is to be run");
            assert!(!line.contains(crate::scrub::MARKER_PREFIX), "{line}");
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
                                assert!(
                                    rest.next()
                                        .is_some_and(|v| v.len() == 3 && v.starts_with("/f")),
                                    "{line}"
                                );
                            }
                        } else {
                            args.push(word.as_str());
                        }
                    }
                    assert_eq!(args.len(), *positionals, "{line}");
                    if command == "create_exchange" {
                        assert_eq!(args[0], "topic", "type first, then the name: {line}");
                        assert!(
                            args[1].starts_with("x.in.f")
                                || args[1].starts_with("host.")
                                || FLEET_EXCHANGES.contains(&args[1]),
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
                    let url = &words[words.len() - 1];
                    if let Some(path) = url.strip_prefix("http://localhost/api/bindings/%2Ff1/e/") {
                        let at = words.iter().position(|w| w == "--data").unwrap();
                        let body: serde_json::Value = serde_json::from_str(&words[at + 1]).unwrap();
                        let key = body["routing_key"].as_str().unwrap();
                        let (source, destination) = path.split_once("/e/").unwrap();
                        assert!(binds(source, destination, key), "{line}");
                        assert!(words.contains(&"POST".to_owned()), "{line}");
                        seen.push("bind".to_owned());
                        continue;
                    }
                    let user = url.strip_prefix("http://localhost/api/users/").unwrap();
                    assert!(user == "f1" || user.starts_with("f1."), "{line}");
                    assert!(
                        line.contains("--data-binary @- ")
                            && line.ends_with(&format!("< /path/to/{user}.user.json"))
                    );
                    seen.push("user".to_owned());
                }
                "sock=/tmp/lavinmqctl.sock" => {}
                other => panic!("unexpected command `{other}`: {line}"),
            }
        }
        seen
    }

    #[test]
    fn the_lavinmq_script_follows_lavinmqctl_and_the_control_socket_api() {
        let text = script(
            "f1",
            &["f2".to_owned(), "f3".to_owned()],
            (true, None),
            Tool::Lavinmqctl,
        );
        let seen = lavinmq_commands(&text, |source, destination, key| {
            source.starts_with("x.in.f") && INGRESS_BINDINGS.contains(&(destination, key))
        });
        assert_eq!(
            seen,
            [
                "add_vhost",
                "user",
                "set_permissions",
                "create_exchange",
                "create_exchange",
                "create_exchange",
                "bind",
                "bind",
                "set_permissions",
                "create_exchange",
                "bind",
                "bind",
                "set_permissions"
            ]
        );
        // The host's script: its user, its permissions, its exchange bound from fleet.send with
        // its own keys, write into the admitting fleet.
        let host = host_script(("f1", "h1.lab"), &["f2".to_owned()], Tool::Lavinmqctl, None);
        let seen = lavinmq_commands(&host, |source, destination, key| {
            source == SEND_EXCHANGE
                && destination == "host.h1.lab"
                && host_binding_keys("h1.lab").contains(&key.to_owned())
        });
        assert_eq!(
            seen,
            [
                "user",
                "set_permissions",
                "create_exchange",
                "bind",
                "bind",
                "set_permissions"
            ]
        );
        for key in host_binding_keys("h1.lab") {
            assert!(
                host.contains(&format!("{{\"routing_key\":\"{key}\"}}")),
                "{key} verbatim: {host}"
            );
        }
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
                    &format!("http://localhost/api/permissions/%2Ff1/{origin}.HOST")
                ]
            );
        }
    }

    #[test]
    fn script_never_holds_a_password_and_quotes_patterns() {
        for tool in [Tool::Rabbitmqctl, Tool::Lavinmqctl] {
            let text = script("fleet01", &["mac".to_owned()], (true, None), tool);
            assert!(text.contains(r"'^x\.in\.mac$'"), "{text}");
            assert!(
                text.contains("set_permissions -p /fleet01 fleet01"),
                "{text}"
            );
            assert!(
                !text.to_lowercase().contains("password\":\"") || text.contains("…"),
                "{text}"
            );
            // Without --shared-user: no fleet-wide user, no permission for any user; the
            // exchanges and the admitted fleet's ingress are still there.
            let hosts_only = script("fleet01", &["mac".to_owned()], (false, None), tool);
            for absent in ["add_user", "/api/users/"] {
                assert!(!hosts_only.contains(absent), "{absent} in {hosts_only}");
            }
            // The only rights granted: the admin's, on the exchanges it declares, for the
            // duration.
            for line in hosts_only.lines().filter(|l| l.contains("set_permissions")) {
                assert!(line.contains("\"$admin\""), "{line}");
            }
            for present in ["fleet.send", "x.in.mac", "--host HOST --into fleet01"] {
                assert!(hosts_only.contains(present), "{present} in {hosts_only}");
            }
        }
    }
}
