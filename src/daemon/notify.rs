//! The systemd notify protocol (`Type=notify`, `WatchdogSec=`): `READY=1`, `STATUS=…`,
//! `WATCHDOG=1`, `STOPPING=1` as datagrams to `$NOTIFY_SOCKET` (sd_notify(3)). Without that
//! variable every call is a no-op, so the daemon runs the same by hand.
//!
//! The watchdog is pinged from the daemon's main loop (never from a detached timer): a loop that
//! stops turning stops the pings, and systemd kills and restarts the service.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager, if there is one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket) and `$WATCHDOG_USEC`
    /// (honoured only when `$WATCHDOG_PID` is unset or names this process).
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|value| {
            let address = address(value.as_encoded_bytes())?;
            match UnixDatagram::unbound() {
                Ok(socket) => Some((socket, address)),
                Err(error) => {
                    tracing::warn!(%error, "cannot open a socket for NOTIFY_SOCKET");
                    None
                }
            }
        });
        let for_us = std::env::var("WATCHDOG_PID")
            .map_or(true, |pid| pid.trim() == std::process::id().to_string());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.trim().parse::<u64>().ok())
            .filter(|usec| *usec > 0 && for_us)
            .map(Duration::from_micros);
        Notifier { target, watchdog }
    }

    /// How often to ping: half the watchdog timeout (sd_watchdog_enabled(3)), if one is set.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|timeout| timeout / 2)
    }

    /// Start-up is done: the local API serves.
    pub fn ready(&self, status: &str) {
        self.send(&format!(
            "READY=1\nSTATUS={}\nMAINPID={}",
            one_line(status),
            std::process::id()
        ));
    }

    /// A new free-text status (`systemctl status` shows it).
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// The main loop is alive.
    pub fn watchdog(&self) {
        if self.watchdog.is_some() {
            self.send("WATCHDOG=1");
        }
    }

    /// Shutdown has begun.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    fn send(&self, message: &str) {
        if let Some((socket, address)) = &self.target
            && let Err(error) = socket.send_to_addr(message.as_bytes(), address)
        {
            tracing::warn!(%error, "cannot notify the service manager");
        }
    }
}

/// `$NOTIFY_SOCKET` as an address: an absolute path, or `@name` (Linux abstract namespace).
fn address(value: &[u8]) -> Option<SocketAddr> {
    match value.split_first() {
        Some((b'/', _)) => {
            use std::os::unix::ffi::OsStrExt;
            SocketAddr::from_pathname(std::path::Path::new(std::ffi::OsStr::from_bytes(value))).ok()
        }
        #[cfg(target_os = "linux")]
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name).ok()
        }
        _ => {
            tracing::warn!("NOTIFY_SOCKET is neither a path nor @abstract: ignored");
            None
        }
    }
}

/// Status text on one line (the protocol separates assignments with newlines).
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}
