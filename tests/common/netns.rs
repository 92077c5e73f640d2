//! Two hosts on one machine, as the operators run them: each in its own network namespace
//! with a veth link to the machine's namespace — where the broker is — and nothing else, and
//! each with its own mount namespace in which the other host's directory is an empty tmpfs.
//! RabbitMQ listens on 127.0.0.1 only, so a forwarder in this process listens on each link's
//! machine-side address and copies bytes to 127.0.0.1:5672 (a real TCP path, no mock).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One namespace host: its netns, the broker address it sees, and the directory it hides.
pub struct NetHost {
    /// The network namespace.
    pub ns: String,
    /// The machine side of its link (where its broker forwarder listens).
    pub gateway: Ipv4Addr,
    /// Its own address.
    pub address: Ipv4Addr,
    /// The other host's directory, hidden from this one.
    pub hidden: PathBuf,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`ip` (iproute2) is missing: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {} (network namespaces need root)",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetHost {
    /// Creates namespace `ns` linked to the machine over `10.<net>.<sub>.0/30`, with a broker
    /// forwarder on the machine side; `hidden` is the directory this host must not see.
    pub fn create(ns: &str, net: u8, sub: u8, hidden: &Path) -> NetHost {
        let _ = Command::new("ip").args(["netns", "del", ns]).output(); // a crashed run's
        ip(&["netns", "add", ns]);
        let (outer, inner) = (format!("{ns}o"), format!("{ns}i"));
        let _ = Command::new("ip").args(["link", "del", &outer]).output();
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ]);
        ip(&["link", "set", &inner, "netns", ns]);
        let gateway = Ipv4Addr::new(10, net, sub, 1);
        let address = Ipv4Addr::new(10, net, sub, 2);
        ip(&["addr", "add", &format!("{gateway}/30"), "dev", &outer]);
        ip(&["link", "set", &outer, "up"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{address}/30"),
            "dev",
            &inner,
        ]);
        ip(&["-n", ns, "link", "set", &inner, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        forward(SocketAddrV4::new(gateway, 5672));
        NetHost {
            ns: ns.to_owned(),
            gateway,
            address,
            hidden: hidden.to_owned(),
        }
    }

    /// `command` run inside this host: its network namespace and a mount namespace in which
    /// the other host's directory is an empty tmpfs.
    pub fn wrap(&self, command: &Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped
            .args([
                "netns",
                "exec",
                &self.ns,
                "unshare",
                "--mount",
                "--propagation",
                "private",
            ])
            .args([
                "--",
                "sh",
                "-c",
                "mount -t tmpfs none \"$0\" && exec \"$@\"",
            ])
            .arg(&self.hidden);
        super::run_through(wrapped, command)
    }

    /// A shell command run inside this host: did it succeed?
    pub fn sh(&self, script: &str) -> bool {
        let mut command = Command::new("bash");
        command.args(["-c", script]);
        self.wrap(&command)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

impl Drop for NetHost {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and so the pair.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Accepts on `listen` and copies each connection both ways to the broker on 127.0.0.1:5672.
fn forward(listen: SocketAddrV4) {
    let listener = TcpListener::bind(listen)
        .unwrap_or_else(|e| panic!("cannot listen on {listen} for the broker: {e}"));
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(broker) = TcpStream::connect("127.0.0.1:5672") else {
                continue; // the broker is down: the client sees the connection close
            };
            let _ = client.set_nodelay(true);
            let _ = broker.set_nodelay(true);
            let (Ok(client_read), Ok(broker_read)) = (client.try_clone(), broker.try_clone())
            else {
                continue;
            };
            std::thread::spawn(move || pipe(client_read, broker));
            std::thread::spawn(move || pipe(broker_read, client));
        }
    });
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
