//! Opening a connection from the broker secret without ever formatting the URI.

use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{Connection, ConnectionProperties};
use secrecy::ExposeSecret;

use crate::secret::BrokerUri;

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
    /// The broker could not be reached or the handshake failed.
    #[error("cannot connect to the broker at {host}:{port}: {reason}")]
    Unreachable {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// What happened.
        reason: String,
    },
}

/// Connects to `vhost` (default: the URI's) with the URI's credential.
pub async fn connect(uri: &BrokerUri, vhost: Option<&str>) -> Result<Connection, ConnectError> {
    let vhost = vhost.unwrap_or(&uri.vhost).to_owned();
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
            host: uri.host.clone(),
            port: uri.port,
        },
        vhost: vhost.clone(),
        query: AMQPQueryString {
            heartbeat: Some(uri.heartbeat),
            connection_timeout: Some(10_000),
            ..AMQPQueryString::default()
        },
    };
    let properties = ConnectionProperties::default().with_connection_name("fleetd".into());
    Connection::connect_uri(amqp, properties)
        .await
        .map_err(|error| {
            let reason = error.to_string();
            if reason.contains("ACCESS_REFUSED")
                || reason.contains("NOT_ALLOWED")
                || reason.contains("access")
            {
                ConnectError::Refused { vhost, reason }
            } else {
                ConnectError::Unreachable {
                    host: uri.host.clone(),
                    port: uri.port,
                    reason,
                }
            }
        })
}
