//! `fleetd broker grants --apply`: carries out the grants with `rabbitmqctl` (argv only, the
//! password on stdin) and declares the exchanges and their bindings over AMQP as the admin, who
//! holds rights on them only for that moment.

use std::process::Stdio;
use std::time::Duration;

use lapin::ExchangeKind;
use lapin::options::{ExchangeBindOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use secrecy::{ExposeSecret, SecretString};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::grants::{
    FLEET_EXCHANGES, Permissions, admitted_permissions, host_permissions, host_user,
    own_permissions, vhost,
};
use super::topology::{
    INGRESS_BINDINGS, SEND_EXCHANGE, host_binding_keys, host_exchange, ingress_exchange,
};
use super::{ConnectError, connect};
use crate::secret::BrokerUri;

const RABBITMQCTL: &str = "rabbitmqctl";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Why applying the grants failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// `rabbitmqctl` could not be run.
    #[error("cannot run `rabbitmqctl {command}`")]
    Spawn {
        /// The subcommand.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// `rabbitmqctl` failed or timed out.
    #[error("`rabbitmqctl {command}` failed: {detail}")]
    Failed {
        /// The subcommand.
        command: String,
        /// Its stderr (no password ever reaches it).
        detail: String,
    },
    /// The admin could not connect to declare exchanges.
    #[error("cannot declare the exchanges as the admin")]
    Admin(#[source] ConnectError),
    /// Declaring an exchange or binding one failed.
    #[error("declaring `{exchange}` failed: {detail}")]
    Declare {
        /// The exchange.
        exchange: String,
        /// Why.
        detail: String,
    },
}

/// The `rabbitmqctl` that carries the grants out: the local node, or `-n NODE` (any node of a
/// cluster: users, vhosts and permissions are cluster-wide).
#[derive(Clone, Debug, Default)]
pub struct Rabbitmqctl {
    node: Option<String>,
}

/// A node name `--node` will not pass on (it must be `name@host`, no spaces or shell words).
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` is not a node name (`NAME@HOST`: letters, digits, `_`, `-`, `.`, each part starting with a letter or digit)"
)]
pub struct BadNode(String);

impl Rabbitmqctl {
    /// `rabbitmqctl -n NODE` when `node` is given, else the local node.
    pub fn new(node: Option<&str>) -> Result<Rabbitmqctl, BadNode> {
        let Some(node) = node else {
            return Ok(Rabbitmqctl::default());
        };
        let part = |p: &str| {
            p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        };
        match node.split_once('@') {
            Some((name, host)) if part(name) && part(host) => Ok(Rabbitmqctl {
                node: Some(node.to_owned()),
            }),
            _ => Err(BadNode(node.to_owned())),
        }
    }
}

/// Applies the grants for `fleet` through `ctl`: its vhost, its exchanges (declared and bound
/// by `admin`), each admitted origin's ingress exchange; with `shared` (a password), also the
/// shared fleet user `FLEET`. Returns one line per step for the operator.
pub async fn apply(
    fleet: &str,
    admits: &[String],
    shared: Option<&SecretString>,
    admin: &BrokerUri,
    ctl: &Rabbitmqctl,
) -> Result<Vec<String>, ApplyError> {
    let mut report = Vec::new();
    let vhost = vhost(fleet);
    if !ctl.listed(&["list_vhosts", "name"]).await?.contains(&vhost) {
        ctl.run(&["add_vhost", &vhost], None).await?;
        report.push(format!("created vhost {vhost}"));
    }
    let users = ctl.listed(&["list_users"]).await?;
    match shared {
        Some(password) => {
            if users.iter().any(|u| u == fleet) {
                ctl.run(&["change_password", fleet], Some(password)).await?;
                report.push(format!("set the password of user {fleet}"));
            } else {
                ctl.run(&["add_user", fleet], Some(password)).await?;
                report.push(format!("created user {fleet}"));
            }
            ctl.run(&["set_user_tags", fleet], None).await?;
            ctl.set_permissions(&vhost, fleet, &own_permissions())
                .await?;
            report.push(format!(
                "user {fleet}: no tags, every host's objects on {vhost} (shared: its hosts are not isolated from each other)"
            ));
        }
        None if users.iter().any(|u| u == fleet) => report.push(format!(
            "note: the shared user {fleet} exists and reaches every host's queues; once every host has its own user (--host), remove it: rabbitmqctl delete_user {fleet}"
        )),
        None => {}
    }
    let mut exchanges: Vec<String> = FLEET_EXCHANGES.map(str::to_owned).to_vec();
    let mut bindings = Vec::new();
    for origin in admits {
        let exchange = ingress_exchange(origin);
        for (destination, key) in INGRESS_BINDINGS {
            bindings.push(Binding {
                source: exchange.clone(),
                destination: destination.to_owned(),
                key: key.to_owned(),
            });
        }
        exchanges.push(exchange);
    }
    declare_as_admin(&vhost, (&exchanges, &bindings), admin, ctl).await?;
    report.push(format!(
        "declared the fleet's exchanges in {vhost} ({})",
        FLEET_EXCHANGES.join(", ")
    ));
    for origin in admits {
        report.push(format!(
            "declared {} in {vhost}, bound to {}",
            ingress_exchange(origin),
            INGRESS_BINDINGS
                .map(|(to, key)| format!("{to} ({key})"))
                .join(" and ")
        ));
        if users.iter().any(|u| u == origin) {
            ctl.set_permissions(&vhost, origin, &admitted_permissions(origin))
                .await?;
            report.push(format!(
                "shared user {origin}: write on {} only",
                ingress_exchange(origin)
            ));
        }
        report.push(format!(
            "hosts of {origin} write into it once their grants name this fleet: fleetd broker grants --fleet {origin} --host HOST --into {fleet} --apply"
        ));
    }
    Ok(report)
}

/// Applies the grants for host `host` of `fleet`: its user `FLEET.HOST` (no tags, `password`),
/// its own-queue permissions on `/FLEET`, its exchange `host.HOST` bound from `fleet.send` with
/// its keys (declared by `admin`), and write on `x.in.FLEET` in each fleet of `into`. The
/// fleet's grants must have run first (its vhost and exchanges).
pub async fn apply_host(
    (fleet, host): (&str, &str),
    into: &[String],
    password: &SecretString,
    (admin, ctl): (&BrokerUri, &Rabbitmqctl),
) -> Result<Vec<String>, ApplyError> {
    let vhosts = ctl.listed(&["list_vhosts", "name"]).await?;
    for needed in std::iter::once(fleet).chain(into.iter().map(String::as_str)) {
        if !vhosts.contains(&vhost(needed)) {
            return Err(ApplyError::Failed {
                command: "list_vhosts".to_owned(),
                detail: format!(
                    "there is no vhost {}: run `fleetd broker grants --fleet {needed}` first",
                    vhost(needed)
                ),
            });
        }
    }
    let user = host_user(fleet, host);
    let mut report = Vec::new();
    if ctl.listed(&["list_users"]).await?.contains(&user) {
        ctl.run(&["change_password", &user], Some(password)).await?;
        report.push(format!("set the password of user {user}"));
    } else {
        ctl.run(&["add_user", &user], Some(password)).await?;
        report.push(format!("created user {user}"));
    }
    ctl.run(&["set_user_tags", &user], None).await?;
    ctl.set_permissions(&vhost(fleet), &user, &host_permissions(host))
        .await?;
    report.push(format!(
        "user {user}: no tags, its own queues on {}",
        vhost(fleet)
    ));
    let exchange = host_exchange(host);
    let bindings: Vec<Binding> = host_binding_keys(host)
        .into_iter()
        .map(|key| Binding {
            source: SEND_EXCHANGE.to_owned(),
            destination: exchange.clone(),
            key,
        })
        .collect();
    declare_as_admin(
        &vhost(fleet),
        (std::slice::from_ref(&exchange), &bindings),
        admin,
        ctl,
    )
    .await?;
    report.push(format!(
        "declared {exchange} in {}, bound from {SEND_EXCHANGE} ({})",
        vhost(fleet),
        host_binding_keys(host).join(", ")
    ));
    for target in into {
        ctl.set_permissions(&vhost(target), &user, &admitted_permissions(fleet))
            .await?;
        report.push(format!(
            "user {user}: write on {} in {} only",
            ingress_exchange(fleet),
            vhost(target)
        ));
    }
    Ok(report)
}

/// An exchange-to-exchange binding the admin makes.
struct Binding {
    source: String,
    destination: String,
    key: String,
}

/// Declares `exchanges` (topic, durable) and makes `bindings` between them and the exchanges
/// that exist, as the admin, who gets configure, write and read on exactly those exchanges for
/// the duration and loses them afterwards.
async fn declare_as_admin(
    vhost: &str,
    (exchanges, bindings): (&[String], &[Binding]),
    admin: &BrokerUri,
    ctl: &Rabbitmqctl,
) -> Result<(), ApplyError> {
    let mut names: Vec<&str> = exchanges.iter().map(String::as_str).collect();
    for binding in bindings {
        names.extend([binding.source.as_str(), binding.destination.as_str()]);
    }
    let temporary = super::grants::exactly(&names);
    ctl.set_permissions(vhost, &admin.user, &temporary).await?;
    let result = async {
        let connection = connect(admin, Some(vhost))
            .await
            .map_err(ApplyError::Admin)?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| declare_error("channel", &e))?;
        for name in exchanges {
            let options = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    name.as_str().into(),
                    ExchangeKind::Topic,
                    options,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| declare_error(name, &e))?;
        }
        for binding in bindings {
            channel
                .exchange_bind(
                    binding.destination.as_str().into(),
                    binding.source.as_str().into(),
                    binding.key.as_str().into(),
                    ExchangeBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    declare_error(
                        &format!(
                            "{} → {} ({})",
                            binding.source, binding.destination, binding.key
                        ),
                        &e,
                    )
                })?;
        }
        let _ = connection.close(200, "grants applied".into()).await;
        Ok(())
    }
    .await;
    ctl.run(&["clear_permissions", "-p", vhost, &admin.user], None)
        .await?;
    result
}

fn declare_error(exchange: &str, error: &lapin::Error) -> ApplyError {
    ApplyError::Declare {
        exchange: exchange.to_owned(),
        detail: error.to_string(),
    }
}

impl Rabbitmqctl {
    async fn set_permissions(
        &self,
        vhost: &str,
        user: &str,
        p: &Permissions,
    ) -> Result<(), ApplyError> {
        self.run(
            &[
                "set_permissions",
                "-p",
                vhost,
                user,
                &p.configure,
                &p.write,
                &p.read,
            ],
            None,
        )
        .await
        .map(|_| ())
    }

    /// The first column of a `rabbitmqctl -q list_*` table, header dropped.
    async fn listed(&self, args: &[&str]) -> Result<Vec<String>, ApplyError> {
        let mut full = vec!["-q"];
        full.extend_from_slice(args);
        let out = self.run(&full, None).await?;
        Ok(out
            .lines()
            .skip(1)
            .filter_map(|l| l.split('\t').next())
            .map(str::to_owned)
            .collect())
    }

    /// Runs `rabbitmqctl [-n NODE] ARGS`, feeding `stdin` (a password) if given; returns stdout.
    async fn run(&self, args: &[&str], stdin: Option<&SecretString>) -> Result<String, ApplyError> {
        let command = args
            .iter()
            .find(|a| !a.starts_with('-'))
            .copied()
            .unwrap_or_default()
            .to_owned();
        let node = self.node.iter().flat_map(|n| ["-n", n.as_str()]);
        let mut child = Command::new(RABBITMQCTL)
            .args(node)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ApplyError::Spawn {
                command: command.clone(),
                source,
            })?;
        if let (Some(secret), Some(mut pipe)) = (stdin, child.stdin.take()) {
            #[expect(
                clippy::disallowed_methods,
                reason = "rabbitmqctl reads the new password from stdin"
            )]
            let bytes =
                zeroize::Zeroizing::new(format!("{}\n", secret.expose_secret()).into_bytes());
            pipe.write_all(&bytes)
                .await
                .map_err(|source| ApplyError::Spawn {
                    command: command.clone(),
                    source,
                })?;
        }
        let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| ApplyError::Failed {
                command: command.clone(),
                detail: format!("no answer within {} s", TIMEOUT.as_secs()),
            })?
            .map_err(|source| ApplyError::Spawn {
                command: command.clone(),
                source,
            })?;
        if !output.status.success() {
            let detail = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            return Err(ApplyError::Failed { command, detail });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_must_be_name_at_host() {
        assert!(Rabbitmqctl::new(None).unwrap().node.is_none());
        let ctl = Rabbitmqctl::new(Some("rabbit@broker-2.example")).unwrap();
        assert_eq!(ctl.node.as_deref(), Some("rabbit@broker-2.example"));
        for bad in [
            "rabbit", "@host", "rabbit@", "a@b c", "-n@x", "a@b@c", "r;x@h",
        ] {
            let refused = Rabbitmqctl::new(Some(bad));
            assert!(refused.is_err(), "{bad}");
        }
    }
}
