//! The broker URI, parsed by hand so it is never formatted: the AMQP crates' URI types print the
//! password in `Debug`, and their parse errors contain the whole URI.
//!
//! One credential may name several nodes of a cluster, comma-separated in the authority:
//! `amqps://fleet01:PASSWORD@n1.example:5671,n2.example:5671,n3.example/fleet01`. Every node
//! takes the same user, password, vhost and TLS setting (a cluster shares its users); fleetd
//! connects to any of them ([`BrokerUri::nodes`], tried in turn from [`BrokerUri::first_choice`]).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use secrecy::{ExposeSecret, SecretString};
use zeroize::Zeroizing;

/// One broker node: a host name or address (IPv6 without brackets) and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Host name or address.
    pub host: String,
    /// Port: given, or 5672 / 5671.
    pub port: u16,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The most nodes one URI may name.
pub const MAX_NODES: usize = 16;

/// An `amqp://` or `amqps://` URI naming one or more nodes. `Debug` shows everything but the
/// password.
pub struct BrokerUri {
    /// `true` for `amqps`.
    pub tls: bool,
    /// The user name (percent-decoded).
    pub user: String,
    /// The password (percent-decoded).
    pub password: SecretString,
    /// The nodes, in the order given; never empty, no node twice.
    pub nodes: Vec<Node>,
    /// The vhost (percent-decoded; `/` when the path is empty).
    pub vhost: String,
    /// Heartbeat in seconds: the URI's `heartbeat=` or 10.
    pub heartbeat: u16,
    /// The only CAs trusted for `amqps` (PEM), from `broker.ca_file`; `None`: the platform's
    /// trust store. Not part of the URI: the daemon sets it from config.
    pub ca_pem: Option<std::sync::Arc<str>>,
    /// The node the next connection tries first (an index into `nodes`): random at first, so
    /// the hosts of a fleet spread over the cluster; moved on past a node whose connection was
    /// lost ([`BrokerUri::lost`]).
    preferred: AtomicUsize,
}

impl fmt::Debug for BrokerUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerUri")
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("nodes", &self.nodes)
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
    /// The same node is named twice, or more than [`MAX_NODES`] are named.
    #[error("broker uri: the node list names a node twice or more than 16 nodes")]
    Nodes,
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
        let mut nodes: Vec<Node> = Vec::new();
        for hostport in hostport.split(',') {
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
            let node = Node { host, port };
            if nodes.contains(&node) || nodes.len() == MAX_NODES {
                return Err(UriError::Nodes);
            }
            nodes.push(node);
        }
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
            preferred: AtomicUsize::new(random_below(nodes.len())),
            nodes,
            vhost,
            heartbeat,
            ca_pem: None,
        })
    }

    /// The index of the node a connection tries first; the others follow in order, wrapping.
    pub fn first_choice(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.nodes.len()
    }

    /// A connection to node `index` opened: later connections (the delivery pump's, the next
    /// link's) try it first.
    pub fn opened(&self, index: usize) {
        self.preferred.store(index, Ordering::Relaxed);
    }

    /// The connection to node `index` was lost: unless another connection already moved on, the
    /// next attempt starts at the node after it, so a dead node costs no connect timeout.
    pub fn lost(&self, index: usize) {
        let next = (index + 1) % self.nodes.len();
        let _ = self
            .preferred
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The distinct ports of the nodes (what the sandbox lets fleetd connect to).
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The nodes as `host:port`, comma-separated (for logs and status: never the credential).
    pub fn node_list(&self) -> String {
        let names: Vec<String> = self.nodes.iter().map(Node::to_string).collect();
        names.join(",")
    }
}

/// A random number below `n` (`n` > 0) from the OS source; 0 if the source fails (the order
/// then is the URI's, which is still correct).
fn random_below(n: usize) -> usize {
    let mut bytes = [0u8; 2];
    if getrandom::fill(&mut bytes).is_err() {
        return 0;
    }
    usize::from(u16::from_le_bytes(bytes)) % n.max(1)
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
