//! A private, headless, real herdr server per test (herdr 0.8.2: its own HOME and config
//! directory, update and manifest checks off, so it reaches nothing outside this machine).
//!
//! The binary is found through `HERDR_BIN`, else `herdr` on PATH, else the vendored build beside
//! the project (`../shared/vendor/herdr/herdr`). `scripts/test` exports `HERDR_BIN`; without a
//! herdr it fails in CI and, elsewhere, skips these tests and says so in its summary.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where the herdr binary is, or why there is none.
pub fn binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("HERDR_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("HERDR_BIN={} is not a file", bin.display()))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("herdr"))
            .find(|bin| bin.is_file())
    });
    let vendored = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vendor/herdr/herdr");
    on_path
        .or_else(|| vendored.is_file().then_some(vendored))
        .ok_or_else(|| {
            "no herdr binary: set HERDR_BIN, put herdr on PATH, or place herdr 0.8.2 at \
             ../shared/vendor/herdr/herdr"
                .to_owned()
        })
}

/// A fake coding agent named `claude` in `dir` (outside every PATH): it runs the shell line
/// `greeting`, then shows Claude Code's prompt glyph (herdr's claude manifest takes `❯` for
/// idle) and answers each line with `got: LINE`. Its path.
pub fn fake_claude(dir: &Path, greeting: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("claude");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n{greeting}\n\
             while :; do printf '\\342\\235\\257 '; IFS= read -r line || exit 0; \
             printf 'got: %s\\n' \"$line\"; done\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A running `herdr server` in a directory of its own; stopped (with its panes) on drop.
pub struct HerdrServer {
    pub home: Home,
    child: Child,
}

/// A server's home directory, removed when the server that owns it stops (a restarted server
/// takes over the same directory).
pub struct Home(PathBuf);

impl Home {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl HerdrServer {
    /// Starts a fresh server: no workspace, no pane.
    pub fn start() -> HerdrServer {
        HerdrServer::start_in(tempfile::tempdir().unwrap().keep())
    }

    /// Starts a server whose home is `home` (an earlier server's, to restart it there).
    pub fn start_in(home: PathBuf) -> HerdrServer {
        let bin = binary().unwrap_or_else(|why| panic!("the herdr tests need herdr: {why}"));
        let home = Home(home);
        let config = home.path().join("cfg");
        std::fs::create_dir_all(config.join("herdr")).unwrap();
        std::fs::write(
            config.join("herdr/config.toml"),
            "onboarding = false\n[update]\nversion_check = false\nmanifest_check = false\n",
        )
        .unwrap();
        let child = Command::new(&bin)
            .arg("server")
            .env_clear()
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", &config)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("SHELL", "/bin/bash")
            .env("TERM", "xterm-256color")
            .env("LANG", "C.UTF-8")
            .current_dir(home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        let server = HerdrServer { home, child };
        let start = Instant::now();
        while server.try_call("ping", json!({})).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "herdr server did not answer at {}",
                server.socket().display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.home.path().join("cfg/herdr/herdr.sock")
    }

    /// herdr's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.path().join("cfg/herdr/herdr-server.log"))
            .unwrap_or_default()
    }

    /// One API call: the result, or the error object.
    pub fn try_call(&self, method: &str, params: Value) -> Result<Value, Value> {
        let mut stream = UnixStream::connect(self.socket()).map_err(|e| json!(e.to_string()))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut line = json!({"id": "t", "method": method, "params": params}).to_string();
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .map_err(|e| json!(e.to_string()))?;
        let mut reply = String::new();
        BufReader::new(stream)
            .read_line(&mut reply)
            .map_err(|e| json!(e.to_string()))?;
        let reply: Value = serde_json::from_str(&reply).map_err(|e| json!(e.to_string()))?;
        match reply.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(reply["result"].clone()),
        }
    }

    /// One API call that must succeed.
    pub fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params.clone())
            .unwrap_or_else(|e| panic!("herdr {method} {params}: {e}"))
    }

    /// A pane's rectangle (x, y, width, height) in its tab's layout.
    pub fn rect(&self, pane: &str) -> (u64, u64, u64, u64) {
        let layout = self.call("pane.layout", json!({"pane_id": pane}));
        let rect = layout["layout"]["panes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pane_id"] == pane)
            .map(|p| p["rect"].clone())
            .unwrap();
        let n = |k: &str| rect[k].as_u64().unwrap();
        (n("x"), n("y"), n("width"), n("height"))
    }

    /// The whole visible screen of `pane` and its recent history, wraps joined.
    pub fn text(&self, pane: &str) -> String {
        self.call(
            "pane.read",
            json!({"pane_id": pane, "source": "recent_unwrapped", "lines": 1000}),
        )["read"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The pid of the process in `pane`'s foreground that is not its shell, if there is one.
    pub fn foreground_pid(&self, pane: &str) -> Option<u64> {
        let info = self.call("pane.process_info", json!({"pane_id": pane}));
        let shell = info["process_info"]["shell_pid"].as_u64();
        info["process_info"]["foreground_processes"]
            .as_array()?
            .iter()
            .filter_map(|p| p["pid"].as_u64())
            .find(|pid| Some(*pid) != shell)
    }

    /// The config line and environment that point a daemon at this server.
    pub fn daemon_env(&self) -> (String, String) {
        (
            "multiplexer = \"herdr\"\n".to_owned(),
            self.socket().to_str().unwrap().to_owned(),
        )
    }
}

impl Drop for HerdrServer {
    fn drop(&mut self) {
        let _ = self.try_call("server.stop", json!({}));
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.home.0.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.home.0);
        }
    }
}

impl HerdrServer {
    /// Stops the server and keeps its home for [`HerdrServer::start_in`].
    pub fn stop_keeping_home(mut self) -> PathBuf {
        let home = std::mem::replace(&mut self.home, Home(PathBuf::new()));
        drop(self);
        home.0
    }
}
