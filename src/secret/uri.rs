//! The broker URI, parsed by hand so it is never formatted: the AMQP crates' URI types print the
//! password in `Debug`, and their parse errors contain the whole URI.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use zeroize::Zeroizing;

/// An `amqp://` or `amqps://` URI. `Debug` shows everything but the password.
pub struct BrokerUri {
    /// `true` for `amqps`.
    pub tls: bool,
    /// The user name (percent-decoded).
    pub user: String,
    /// The password (percent-decoded).
    pub password: SecretString,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port: given, or 5672 / 5671.
    pub port: u16,
    /// The vhost (percent-decoded; `/` when the path is empty).
    pub vhost: String,
    /// Heartbeat in seconds: the URI's `heartbeat=` or 10.
    pub heartbeat: u16,
    /// The only CAs trusted for `amqps` (PEM), from `broker.ca_file`; `None`: the platform's
    /// trust store. Not part of the URI: the daemon sets it from config.
    pub ca_pem: Option<std::sync::Arc<str>>,
}

impl fmt::Debug for BrokerUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerUri")
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("vhost", &self.vhost)
            .field("heartbeat", &self.heartbeat)
            .field("ca_pinned", &self.ca_pem.is_some())
            .finish()
    }
}

/// What is wrong with a broker URI. Never contains any part of it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UriError {
    /// The scheme is not `amqp` or `amqps`.
    #[error("broker uri: scheme must be `amqp` or `amqps`")]
    Scheme,
    /// No `user:password@` part.
    #[error("broker uri: user and password are required (`amqp://USER:PASSWORD@HOST/VHOST`)")]
    Userinfo,
    /// The host is empty or malformed.
    #[error("broker uri: the host is missing or malformed")]
    Host,
    /// The port is not a number in range.
    #[error("broker uri: the port is not a number from 1 to 65535")]
    Port,
    /// A percent escape is malformed or decodes to invalid UTF-8.
    #[error("broker uri: a percent-escape is malformed")]
    Escape,
    /// A query parameter is unknown or has a bad value.
    #[error("broker uri: unsupported query parameter (only `heartbeat=SECONDS`)")]
    Query,
}

impl BrokerUri {
    /// Parses the URI held in `secret`.
    pub fn parse(secret: &SecretString) -> Result<Self, UriError> {
        #[expect(
            clippy::disallowed_methods,
            reason = "parsing needs the text; nothing is printed"
        )]
        let text = secret.expose_secret();
        let (tls, rest) = if let Some(rest) = text.strip_prefix("amqps://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("amqp://") {
            (false, rest)
        } else {
            return Err(UriError::Scheme);
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = authority.rsplit_once('@').ok_or(UriError::Userinfo)?;
        let (user, password) = userinfo.split_once(':').ok_or(UriError::Userinfo)?;
        let user = decode(user)?;
        let password = Zeroizing::new(decode(password)?);
        if user.is_empty() {
            return Err(UriError::Userinfo);
        }
        let (host, port) = split_host_port(hostport)?;
        let port = match port {
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or(UriError::Port)?,
            None if tls => 5671,
            None => 5672,
        };
        let vhost = if path.is_empty() {
            "/".to_owned()
        } else {
            decode(path)?
        };
        let mut heartbeat = 10;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("heartbeat", value)) => {
                    heartbeat = value.parse().map_err(|_| UriError::Query)?;
                }
                _ => return Err(UriError::Query),
            }
        }
        Ok(BrokerUri {
            tls,
            user,
            password: SecretString::from(password.as_str()),
            host,
            port,
            vhost,
            heartbeat,
            ca_pem: None,
        })
    }
}

fn split_host_port(hostport: &str) -> Result<(String, Option<&str>), UriError> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(UriError::Host)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(UriError::Host)?),
        };
        return Ok((host.to_owned(), port));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (hostport, None),
    };
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if !valid {
        return Err(UriError::Host);
    }
    Ok((host.to_owned(), port))
}

/// Percent-decodes `text` into UTF-8.
fn decode(text: &str) -> Result<String, UriError> {
    let mut bytes = Zeroizing::new(Vec::with_capacity(text.len()));
    let mut input = text.bytes();
    while let Some(b) = input.next() {
        if b == b'%' {
            let hi = input.next().and_then(|h| char::from(h).to_digit(16));
            let lo = input.next().and_then(|l| char::from(l).to_digit(16));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(UriError::Escape);
            };
            bytes.push(u8::try_from(hi * 16 + lo).map_err(|_| UriError::Escape)?);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        let mut raw = e.into_bytes();
        zeroize::Zeroize::zeroize(&mut raw);
        UriError::Escape
    })
}
