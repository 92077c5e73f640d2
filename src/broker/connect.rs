//! Opening a connection from the broker secret without ever formatting the URI.

use lapin::tcp::{AsyncTcpStream, RustlsConnector, RustlsConnectorConfig};
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{Connection, ConnectionProperties};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use secrecy::ExposeSecret;

use super::AmqpError;
use crate::secret::{BrokerUri, Node};

/// Why a connection could not be opened. Carries lapin's message (no URI, no password: lapin's
/// connection errors name the failure, and callers print them through the scrubber anyway).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The broker refused the credential for this vhost (or the vhost does not exist).
    #[error("the broker refused the credential for vhost `{vhost}`")]
    Refused {
        /// The vhost.
        vhost: String,
        /// The broker's reason.
        reason: String,
    },
    /// The broker has no such vhost (RabbitMQ: `NOT_ALLOWED - vhost V not found`; LavinMQ:
    /// `NOT_ALLOWED - vhost not found`).
    #[error("the broker has no vhost `{vhost}`")]
    NoVhost {
        /// The vhost.
        vhost: String,
        /// The broker's reason.
        reason: String,
    },
    /// No node could be reached, or every handshake failed.
    #[error("cannot connect to the broker: {reason}")]
    Unreachable {
        /// What happened, per node tried (`host:port: reason; …`).
        reason: String,
    },
}

/// How long a whole connection attempt (TCP, TLS, AMQP handshake, `connection.open`) may take.
/// lapin's own `connection_timeout` bounds only the TCP connect; a broker that accepts the
/// socket and then never answers (booting, stopping, a proxy in front of a dead node) would
/// otherwise hold the caller forever, and the caller is the link's one loop.
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// How long the link's loop waits for a frame (a publish, an ack) to be written. lapin resolves
/// a write once its I/O loop has sent it; frames queued as the connection dies may never be, and
/// the loop waiting on one would never see the connection's end (seen after a node kill: a host
/// "connected" for minutes to a dead node).
pub(crate) const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to `vhost` (default: the URI's) with the URI's credential: each node in turn from
/// [`BrokerUri::first_choice`], each within [`HANDSHAKE_TIMEOUT`], until one opens. A refusal
/// (credential, vhost) ends the search: the nodes of a cluster share their users, so the next
/// node would refuse too.
pub async fn connect(uri: &BrokerUri, vhost: Option<&str>) -> Result<Connection, ConnectError> {
    connect_node(uri, vhost)
        .await
        .map(|(connection, ..)| connection)
}

/// [`connect`], also naming the node the connection is to (its index into `uri.nodes`).
pub async fn connect_node(
    uri: &BrokerUri,
    vhost: Option<&str>,
) -> Result<(Connection, usize, Node), ConnectError> {
    let vhost = vhost.unwrap_or(&uri.vhost);
    let first = uri.first_choice();
    let mut failures = Vec::new();
    let order = uri.nodes.iter().enumerate().cycle().skip(first);
    for (index, node) in order.take(uri.nodes.len()) {
        let attempt = tokio::time::timeout(HANDSHAKE_TIMEOUT, connect_unbounded(uri, node, vhost));
        let reason = match attempt.await {
            Ok(Ok(connection)) => {
                uri.opened(index);
                return Ok((connection, index, node.clone()));
            }
            Ok(Err(Failure::Refused(reason))) => {
                let (vhost, reason) = (vhost.to_owned(), format!("{node}: {reason}"));
                return Err(if names_a_missing_vhost(&reason) {
                    ConnectError::NoVhost { vhost, reason }
                } else {
                    ConnectError::Refused { vhost, reason }
                });
            }
            Ok(Err(Failure::Unreachable(reason))) => reason,
            Err(_) => format!(
                "no answer to the handshake for vhost `{vhost}` within {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            ),
        };
        failures.push(format!("{node}: {reason}"));
    }
    Err(ConnectError::Unreachable {
        reason: failures.join("; "),
    })
}

/// Whether a refusal says the vhost does not exist (both brokers word it `vhost … not found`).
fn names_a_missing_vhost(reason: &str) -> bool {
    reason.contains("NOT_ALLOWED") && reason.contains("vhost") && reason.contains("not found")
}

/// How one node's attempt failed.
enum Failure {
    Refused(String),
    Unreachable(String),
}

async fn connect_unbounded(
    uri: &BrokerUri,
    node: &Node,
    vhost: &str,
) -> Result<Connection, Failure> {
    let vhost = vhost.to_owned();
    #[expect(
        clippy::disallowed_methods,
        reason = "lapin authenticates with the plain password"
    )]
    let password = uri.password.expose_secret().to_owned();
    // INVARIANT: this value is never formatted; `AMQPUri`'s Debug would print the password.
    let amqp = AMQPUri {
        scheme: if uri.tls {
            AMQPScheme::AMQPS
        } else {
            AMQPScheme::AMQP
        },
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: uri.user.clone(),
                password,
            },
            host: node.host.clone(),
            port: node.port,
        },
        vhost,
        query: AMQPQueryString {
            heartbeat: Some(uri.heartbeat),
            connection_timeout: Some(10_000),
            ..AMQPQueryString::default()
        },
    };
    let properties = ConnectionProperties::default().with_connection_name("fleetd".into());
    let connected = match (&uri.ca_pem, uri.tls) {
        (Some(pem), true) => {
            let connector =
                pinned_connector(pem).map_err(|e| Failure::Unreachable(e.to_string()))?;
            connect_pinned(amqp, properties, connector).await
        }
        _ => Connection::connect_uri(amqp, properties).await,
    };
    connected.map_err(|error| {
        let reason = error.to_string();
        if reason.contains("ACCESS_REFUSED")
            || reason.contains("NOT_ALLOWED")
            || reason.contains("access")
        {
            Failure::Refused(reason)
        } else {
            Failure::Unreachable(reason)
        }
    })
}

/// A channel on `connection` in confirm mode (every publish answered by ack, nack or return).
pub async fn confirm_channel(connection: &Connection) -> Result<lapin::Channel, AmqpError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::failed("channel"))?;
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .map_err(AmqpError::failed("confirm mode"))?;
    Ok(channel)
}

/// Why `broker.ca_file` cannot be pinned.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The file cannot be read.
    #[error("cannot read `broker.ca_file` `{path}`: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a PEM bundle.
    #[error("`broker.ca_file` is not a PEM bundle: {0}")]
    NotPem(String),
    /// It holds no certificate.
    #[error("`broker.ca_file` holds no certificate")]
    Empty,
    /// rustls cannot build a connector from it.
    #[error("`broker.ca_file`: {0}")]
    Tls(String),
}

/// Pins the CA bundle at `path` (`broker.ca_file`) on `uri`: `amqps` then trusts only those CAs.
pub fn pin_ca(uri: &mut BrokerUri, path: Option<&std::path::Path>) -> Result<(), CaError> {
    let Some(path) = path else {
        return Ok(());
    };
    let pem = std::fs::read_to_string(path).map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })?;
    pinned_connector(&pem)?;
    uri.ca_pem = Some(pem.into());
    Ok(())
}

/// A rustls connector that trusts only the CAs in `pem` (an empty root store otherwise: the
/// platform's trust store plays no part).
fn pinned_connector(pem: &str) -> Result<RustlsConnector, CaError> {
    let mut reader = std::io::BufReader::new(pem.as_bytes());
    let certs = CertificateDer::pem_reader_iter(&mut reader)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaError::NotPem(e.to_string()))?;
    if certs.is_empty() {
        return Err(CaError::Empty);
    }
    let mut config = RustlsConnectorConfig::default();
    config.add_parsable_certificates(certs);
    config
        .connector_with_no_client_auth()
        .map_err(|e| CaError::Tls(e.to_string()))
}

/// Connects over TLS verified by `connector` (lapin's default connector would add the platform's
/// trust store).
async fn connect_pinned(
    amqp: AMQPUri,
    properties: ConnectionProperties,
    connector: RustlsConnector,
) -> lapin::Result<Connection> {
    let runtime = lapin::runtime::default_runtime()?;
    let connector = std::sync::Arc::new(connector);
    Connection::connector(
        amqp,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let host = uri.authority.host.clone();
            let addresses = runtime.to_socket_addrs((host.clone(), uri.authority.port));
            let stream = AsyncTcpStream::connect(&runtime, addresses).await?;
            Ok(stream.into_rustls(&connector, &host).await?)
        },
        properties,
    )
    .await
}
