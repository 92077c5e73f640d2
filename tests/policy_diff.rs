//! `fleetd policy diff` as a reviewer and CI run it: two directories or two git revisions, each
//! format, and the exit codes (0 nothing widens, 1 something widens, 3 a side invalid).

#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

fn fleetd(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("FLEETD_CONFIG")
        .env("FLEETD_CONFIG", dir.join("no-such-config.toml"))
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A copy of the shipped policy in `dir/policy`, with `edit` applied to its grants file.
fn shipped_policy(dir: &Path, edit: impl Fn(String) -> String) {
    let target = dir.join("policy");
    std::fs::create_dir_all(target.join("tests")).unwrap();
    for entry in std::fs::read_dir("policy").unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let text = std::fs::read_to_string(&path).unwrap();
            let text = if path.ends_with("10-grants.toml") {
                edit(text)
            } else {
                text
            };
            std::fs::write(target.join(path.file_name().unwrap()), text).unwrap();
        }
    }
}

fn widen(text: String) -> String {
    text.replace(
        "pattern = \"[A-Z][A-Z0-9]{1,9}-[0-9]{1,6}\"",
        "pattern = \"[A-Z][A-Z0-9]{1,9}-[0-9A-Za-z]{1,6}\"",
    )
}

#[test]
fn directories_in_every_format_with_exit_codes() {
    let root = tempfile::tempdir().unwrap();
    let (old, new) = (root.path().join("old"), root.path().join("new"));
    shipped_policy(&old, |t| t);
    shipped_policy(&new, widen);
    let (old, new) = (old.join("policy"), new.join("policy"));
    let args = |format: &'static str| {
        vec![
            "policy".to_owned(),
            "diff".to_owned(),
            old.display().to_string(),
            new.display().to_string(),
            "--format".to_owned(),
            format.to_owned(),
        ]
    };
    let run = |format| {
        let args = args(format);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fleetd(root.path(), &args)
    };

    let text = run("text");
    assert_eq!(text.status.code(), Some(1), "{}", stdout(&text));
    let shown = stdout(&text);
    assert!(
        shown.contains("1 widened, 0 changed, 0 narrowed: something widens"),
        "{shown}"
    );
    assert!(shown.contains("mac/laptop → worker"), "{shown}");
    assert!(shown.contains("e.g. \"AA-a\""), "{shown}");

    let json: serde_json::Value = serde_json::from_slice(&run("json").stdout).unwrap();
    assert_eq!(json["widens"], true);
    let finding = &json["findings"][0];
    assert_eq!(finding["direction"], "widened");
    assert_eq!(finding["subject"]["kind"], "variable");
    assert_eq!(finding["subject"]["name"], "TASK_ID");
    assert_eq!(finding["scope"]["fleet"], "mac");
    assert_eq!(finding["scope"]["host"], "laptop");
    assert_eq!(finding["rules"][0], "mac-workers");
    assert_eq!(finding["example"], "AA-a");

    let markdown = stdout(&run("markdown"));
    assert!(markdown.contains("**This change grants more"), "{markdown}");
    assert!(
        markdown.contains("| **widened** | env `TASK_ID` |"),
        "{markdown}"
    );

    let sarif: serde_json::Value = serde_json::from_slice(&run("sarif").stdout).unwrap();
    let result = &sarif["runs"][0]["results"][0];
    assert_eq!(result["ruleId"], "policy-diff/widened/env");
    assert_eq!(result["level"], "warning");
    let location = &result["locations"][0]["physicalLocation"];
    assert!(
        location["artifactLocation"]["uri"]
            .as_str()
            .unwrap()
            .ends_with("new/policy/10-grants.toml"),
        "{location}"
    );
    // At the changed pattern's line.
    let line = std::fs::read_to_string("policy/10-grants.toml")
        .unwrap()
        .lines()
        .position(|l| l.starts_with("pattern = \"[A-Z][A-Z0-9]"))
        .unwrap()
        + 1;
    assert_eq!(location["region"]["startLine"], line);

    // The other way round nothing widens; the same directory twice has nothing at all.
    let reverse = fleetd(
        root.path(),
        &[
            "policy",
            "diff",
            &new.display().to_string(),
            &old.display().to_string(),
        ],
    );
    assert_eq!(reverse.status.code(), Some(0), "{}", stdout(&reverse));
    assert!(stdout(&reverse).contains("0 widened, 0 changed, 1 narrowed: nothing widens"));

    // An invalid side: exit 3, with its diagnostics.
    std::fs::write(
        new.join("50-bad.toml"),
        "[[grant]]\nid = \"x\"\nprofles = []\n",
    )
    .unwrap();
    let invalid = fleetd(
        root.path(),
        &[
            "policy",
            "diff",
            &old.display().to_string(),
            &new.display().to_string(),
        ],
    );
    assert_eq!(invalid.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&invalid.stderr).contains("50-bad.toml:3"));
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn git_revisions_and_the_work_tree() {
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path();
    git(dir, &["init", "-q", "-b", "main"]);
    shipped_policy(dir, |t| t);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "policy"]);
    git(dir, &["checkout", "-q", "-b", "change"]);
    shipped_policy(dir, widen);
    git(dir, &["commit", "-q", "-am", "widen TASK_ID"]);

    // The snippet CI runs, with the local default branch: REV..REV.
    let range = fleetd(
        dir,
        &[
            "policy",
            "diff",
            "--git",
            "main..HEAD",
            "--format",
            "markdown",
        ],
    );
    assert_eq!(
        range.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&range.stderr)
    );
    assert!(
        stdout(&range).contains("env `TASK_ID`"),
        "{}",
        stdout(&range)
    );
    // Findings point at NEW's file by its path in the repository.
    let sarif = fleetd(
        dir,
        &["policy", "diff", "--git", "main..HEAD", "--format", "sarif"],
    );
    let sarif: serde_json::Value = serde_json::from_slice(&sarif.stdout).unwrap();
    assert_eq!(
        sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "policy/10-grants.toml"
    );

    // Alone: the merge base with the default branch against the work tree.
    let default = fleetd(dir, &["policy", "diff", "--git"]);
    assert_eq!(
        default.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&default.stderr)
    );
    // An uncommitted revert in the work tree: nothing widens against the merge base.
    shipped_policy(dir, |t| t);
    let reverted = fleetd(dir, &["policy", "diff", "--git"]);
    assert_eq!(reverted.status.code(), Some(0), "{}", stdout(&reverted));
    // A revision without the directory: everything NEW grants is new.
    git(dir, &["checkout", "-q", "--orphan", "empty"]);
    git(dir, &["rm", "-rqf", "--cached", "."]);
    std::fs::write(dir.join("README"), "x").unwrap();
    git(dir, &["add", "README"]);
    git(dir, &["commit", "-q", "-m", "empty"]);
    let from_nothing = fleetd(dir, &["policy", "diff", "--git", "empty..change"]);
    assert_eq!(from_nothing.status.code(), Some(1));
    assert!(stdout(&from_nothing).contains("newly allowed by grant `mac-workers`"));
    // A revision that does not exist: a usage error.
    let missing = fleetd(dir, &["policy", "diff", "--git", "nope..HEAD"]);
    assert_eq!(missing.status.code(), Some(2));
}

/// The shipped policy with the worker's sandbox widened: its TCP ports no longer limited and a
/// path of the agents' home made writable. `policy diff` exits 1 naming both; a profile that
/// shows fleetd's credentials directory is refused by `policy check`.
#[test]
fn a_widened_sandbox_is_a_widening_and_fleetds_places_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let (old, new) = (root.path().join("old"), root.path().join("new"));
    shipped_policy(&old, |t| t);
    shipped_policy(&new, |t| t);
    let profiles = new.join("policy/00-profiles.toml");
    let text = std::fs::read_to_string(&profiles).unwrap();
    let widened = text.replacen(
        "tcp_connect = [443]\nwritable = [\"~/.claude\", \"~/.claude.json\"]",
        "writable = [\"~/.claude\", \"~/.claude.json\", \"~/.ssh\"]",
        1,
    );
    assert_ne!(
        widened, text,
        "the shipped worker's sandbox is as this test expects"
    );
    std::fs::write(&profiles, widened).unwrap();
    let diff = fleetd(
        root.path(),
        &[
            "policy",
            "diff",
            old.join("policy").to_str().unwrap(),
            new.join("policy").to_str().unwrap(),
        ],
    );
    let shown = stdout(&diff);
    assert_eq!(diff.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains("sandbox TCP connect ports [443] → any"),
        "{shown}"
    );
    assert!(
        shown.contains("sandbox writable paths added: ~/.ssh"),
        "{shown}"
    );

    let exposing = text.replacen(
        "writable = [\"~/.claude\", \"~/.claude.json\"]",
        "writable = [\"~/.claude\", \"~/.claude.json\"]\nreadable = [\"/etc/fleetd/credentials\"]",
        1,
    );
    std::fs::write(&profiles, exposing).unwrap();
    let check = fleetd(
        root.path(),
        &["policy", "check", new.join("policy").to_str().unwrap()],
    );
    let said = format!(
        "{}{}",
        stdout(&check),
        String::from_utf8_lossy(&check.stderr)
    );
    assert_ne!(check.status.code(), Some(0), "{said}");
    assert!(said.contains("no agent may see fleetd's"), "{said}");
    assert!(said.contains("/etc/fleetd/credentials"), "{said}");
}
