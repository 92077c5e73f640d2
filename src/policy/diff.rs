//! What a policy change grants: every difference in effective authority between two checked
//! policies, by origin (fleet and host) and profile, for the reviewer of a pull request.
//!
//! Origins are split into classes that every rule treats alike: per fleet named anywhere, each
//! host named by a rule that can apply to that fleet, and "any other host". For each class and
//! profile the two policies' views — the grants that admit it, the denies that refuse it whole
//! or refuse some variables, the profile's fixed names — are compared:
//!
//! - access: some request allowed before and none now, or the reverse;
//! - each grant of NEW that no grant of OLD covers (every request it allows was allowed before)
//!   is reported by what it allows beyond its closest OLD grant (same id, else most variables in
//!   common): variables newly settable, value languages widened or changed (decided on DFAs, see
//!   [`super::lang`]), `cwd`, limits; and the same the other way round for narrowing.
//!
//! A grant covered by one old grant widens nothing, so every request NEW allows and OLD refused
//! falls to a grant that is reported, with the aspect that refused it (property-tested). Profile
//! changes (argv, roots, fixed env, secrets, readiness, limits) are reported once per profile,
//! with the classes that hold it; message decisions are compared class by class.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use super::eval::{DEFAULT_DENY, Effect};
use super::lang::{self, Change, Language, LanguageError};
use super::message::{MessageRequest, Sender, evaluate_message};
use super::model::{
    Deny, EnvRule, Grant, Location, MAILBOX, Network, PolicySet, Profile, Rate, RuleId, Sandbox,
};
use super::names;
use super::request::{Origin, Request};

/// Which way a change moves authority. `Changed` admits something new too, so it counts as
/// widening.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// More is allowed.
    Widened,
    /// Some more, some less.
    Changed,
    /// Less is allowed.
    Narrowed,
}

impl Direction {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Widened => "widened",
            Direction::Changed => "changed",
            Direction::Narrowed => "narrowed",
        }
    }

    /// Whether it gives anything new.
    pub fn widens(self) -> bool {
        self != Direction::Narrowed
    }
}

/// A host class within a fleet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(untagged)]
pub enum Host {
    /// A host some rule names.
    Named(String),
    /// Every host of the fleet that no rule names.
    #[serde(serialize_with = "any_host")]
    Other,
}

fn any_host<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("*")
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Named(name) => f.write_str(name),
            Host::Other => f.write_str("*"),
        }
    }
}

/// Who a finding is about: an origin class and a profile, or a profile for whoever holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Scope {
    /// The origin fleet (`None`: a profile change, for every holder).
    pub fleet: Option<String>,
    /// The origin host class (`None` with `fleet`).
    pub host: Option<Host>,
    /// The profile (or [`MAILBOX`] for a message rule about mailboxes).
    pub profile: String,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.fleet, &self.host) {
            (Some(fleet), Some(host)) => write!(f, "{fleet}/{host} → {}", self.profile),
            _ => write!(f, "profile {}", self.profile),
        }
    }
}

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Subject {
    /// Whether the origin may launch the profile at all.
    Access,
    /// A variable a request may set.
    Variable(String),
    /// Whether a request may choose its working directory.
    Cwd,
    /// A grant's `max_concurrent`.
    MaxConcurrent,
    /// A grant's `rate`.
    Rate,
    /// The profile's `max_instances`.
    MaxInstances,
    /// The profile's command.
    Argv,
    /// The profile's working-directory roots.
    Roots,
    /// A fixed variable of the profile.
    FixedEnv(String),
    /// A secret handed to the profile.
    Secret(String),
    /// The readiness gate and dialog acceptance.
    Readiness,
    /// Profiles its agents may ask for (`may_spawn`).
    MaySpawn,
    /// Whether text from another host may reach its agents at all.
    RemoteMessages,
    /// The sandbox its agents start in.
    Sandbox,
    /// Whether a message from this origin reaches the profile's agents, by sender.
    Message(String),
}

/// One change in effective authority.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Which way.
    pub direction: Direction,
    /// Who it concerns.
    pub scope: Scope,
    /// What it is about.
    pub subject: Subject,
    /// One line for a person.
    pub message: String,
    /// Rules of NEW (or, for what went away, of OLD) that decide it.
    pub rules: Vec<RuleId>,
    /// A value NEW admits and OLD refused (or the reverse, for narrowing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example: Option<String>,
    /// For a profile change: the origin classes that hold the profile in NEW.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// Where in NEW the change is (for SARIF), when NEW has it.
    #[serde(skip)]
    pub location: Option<Location>,
}

/// Every finding, and the origin classes they were computed over.
#[derive(Debug, Default)]
pub struct Report {
    /// Sorted by scope, then subject.
    pub findings: Vec<Finding>,
    /// Per fleet, the hosts named by rules that can apply to it (other hosts are [`Host::Other`]).
    hosts: BTreeMap<String, BTreeSet<String>>,
}

impl Report {
    /// Whether anything widens (the exit status `policy diff` gives CI).
    pub fn widens(&self) -> bool {
        self.findings.iter().any(|f| f.direction.widens())
    }

    /// The class of `origin`'s host for these findings.
    pub fn host_class(&self, origin: &Origin) -> Host {
        let named = self
            .hosts
            .get(&origin.fleet)
            .or_else(|| self.hosts.get(ANY));
        match named {
            Some(named) if named.contains(&origin.host) => Host::Named(origin.host.clone()),
            _ => Host::Other,
        }
    }

    /// Whether some finding accounts for a different decision on `request` (its origin and
    /// profile, and the aspect the request touches: a variable it sets, a `cwd`, a limit).
    pub fn explains(&self, request: &Request) -> bool {
        let host = self.host_class(&request.origin);
        self.findings.iter().any(|f| {
            let scope_matches = f.scope.profile == request.profile
                && match (&f.scope.fleet, &f.scope.host) {
                    (Some(fleet), Some(h)) => *fleet == request.origin.fleet && *h == host,
                    _ => true,
                };
            scope_matches
                && match &f.subject {
                    Subject::Access
                    | Subject::MaxConcurrent
                    | Subject::Rate
                    | Subject::MaxInstances => true,
                    Subject::Variable(name) => request.env.contains_key(name),
                    Subject::Cwd => request.cwd.is_some(),
                    _ => false,
                }
        })
    }

    /// Whether some finding accounts for a different decision on a message.
    pub fn explains_message(&self, request: &MessageRequest) -> bool {
        let host = self.host_class(&request.origin);
        let fleet = if self.hosts.contains_key(&request.origin.fleet) {
            request.origin.fleet.as_str()
        } else {
            ANY
        };
        let sender = sender_name(request.sender);
        self.findings.iter().any(|f| {
            f.scope.profile == request.profile
                && ((f.scope.fleet.as_deref() == Some(fleet)
                    && f.scope.host.as_ref() == Some(&host)
                    && f.subject == Subject::Message(sender.to_owned()))
                    || (f.scope.fleet.is_none() && f.subject == Subject::RemoteMessages))
        })
    }
}

/// The fleet class of every fleet no rule names (for messages).
const ANY: &str = "*";

/// Compares `old` with `new`.
pub fn diff(old: &PolicySet, new: &PolicySet) -> Report {
    let mut languages = Languages::default();
    let mut findings = Vec::new();
    let hosts = host_classes(old, new);
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (fleet, named) in &hosts {
        let classes = named
            .iter()
            .map(|h| Host::Named(h.clone()))
            .chain(std::iter::once(Host::Other));
        for host in classes {
            for profile in profiles_for(fleet, old, new) {
                let before = View::of(old, fleet, &host, &profile);
                let after = View::of(new, fleet, &host, &profile);
                let scope = Scope {
                    fleet: Some(fleet.clone()),
                    host: Some(host.clone()),
                    profile: profile.clone(),
                };
                if after.allowed() {
                    holders
                        .entry(profile.clone())
                        .or_default()
                        .push(format!("{fleet}/{host}"));
                }
                compare_views(&before, &after, &scope, &mut languages, &mut findings);
            }
            for profile in message_profiles(old, new) {
                compare_messages(old, new, fleet, &host, &profile, &mut findings);
            }
        }
    }
    for (name, after) in &new.profiles {
        if let Some(before) = old.profiles.get(name) {
            let held = holders.get(name).cloned().unwrap_or_default();
            compare_profiles(before, after, &held, &mut findings);
        }
    }
    // Origin classes first, then profile changes for every holder.
    findings.sort_by(|a, b| {
        (a.scope.fleet.is_none(), &a.scope, &a.subject).cmp(&(
            b.scope.fleet.is_none(),
            &b.scope,
            &b.subject,
        ))
    });
    findings
        .dedup_by(|a, b| a.scope == b.scope && a.subject == b.subject && a.message == b.message);
    Report { findings, hosts }
}

/// Per fleet named by a rule (and [`ANY`] for the others), the hosts named by rules that can
/// apply to it.
fn host_classes(old: &PolicySet, new: &PolicySet) -> BTreeMap<String, BTreeSet<String>> {
    let mut fleets: BTreeSet<String> = BTreeSet::new();
    for policy in [old, new] {
        for grant in &policy.grants {
            fleets.extend(grant.fleets.iter().cloned());
        }
        for message in &policy.messages {
            fleets.extend(message.fleets.iter().cloned());
        }
        for deny in &policy.denies {
            fleets.extend(deny.fleets.iter().flatten().cloned());
        }
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for fleet in fleets {
        let mut hosts = BTreeSet::new();
        for policy in [old, new] {
            let scoped = policy
                .grants
                .iter()
                .filter(|g| g.fleets.contains(&fleet))
                .filter_map(|g| g.hosts.as_ref());
            let messages = policy
                .messages
                .iter()
                .filter(|m| m.fleets.contains(&fleet))
                .filter_map(|m| m.hosts.as_ref());
            let denies = policy
                .denies
                .iter()
                .filter(|d| d.fleets.as_ref().is_none_or(|f| f.contains(&fleet)))
                .filter_map(|d| d.hosts.as_ref());
            for set in scoped.chain(messages).chain(denies) {
                hosts.extend(set.iter().cloned());
            }
        }
        out.insert(fleet, hosts);
    }
    // Fleets no rule names: no grant admits them, but denies for every fleet and the built-in
    // message rules decide their messages.
    let mut hosts = BTreeSet::new();
    for policy in [old, new] {
        for deny in policy.denies.iter().filter(|d| d.fleets.is_none()) {
            hosts.extend(deny.hosts.iter().flatten().cloned());
        }
    }
    out.insert(ANY.to_owned(), hosts);
    out
}

/// Profiles some grant of either policy offers `fleet`.
fn profiles_for(fleet: &str, old: &PolicySet, new: &PolicySet) -> BTreeSet<String> {
    [old, new]
        .iter()
        .flat_map(|p| p.grants.iter())
        .filter(|g| g.fleets.contains(fleet))
        .flat_map(|g| g.profiles.iter().cloned())
        .collect()
}

/// Profiles a message may be for: every profile of either policy, and mailboxes.
fn message_profiles(old: &PolicySet, new: &PolicySet) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = old.profiles.keys().cloned().collect();
    out.extend(new.profiles.keys().cloned());
    for policy in [old, new] {
        for message in &policy.messages {
            out.extend(message.profiles.iter().cloned());
        }
    }
    out.insert(MAILBOX.to_owned());
    out
}

fn host_admits(hosts: Option<&BTreeSet<String>>, host: &Host) -> bool {
    match (hosts, host) {
        (None, _) => true,
        (Some(set), Host::Named(name)) => set.contains(name),
        (Some(_), Host::Other) => false,
    }
}

/// What one policy lets one origin class do with one profile.
struct View<'a> {
    profile: Option<&'a Profile>,
    /// Denies that refuse the pair whole.
    refused_by: Vec<&'a Deny>,
    /// Variables a deny refuses whenever a request sets them.
    denied_names: BTreeMap<String, Vec<RuleId>>,
    /// Grants that admit the pair, in file order.
    grants: Vec<&'a Grant>,
}

impl<'a> View<'a> {
    fn of(policy: &'a PolicySet, fleet: &str, host: &Host, profile: &str) -> View<'a> {
        let in_scope = |d: &&Deny| {
            d.fleets.as_ref().is_none_or(|f| f.contains(fleet))
                && host_admits(d.hosts.as_ref(), host)
                && d.profiles.as_ref().is_none_or(|p| p.contains(profile))
        };
        let mut refused_by = Vec::new();
        let mut denied_names: BTreeMap<String, Vec<RuleId>> = BTreeMap::new();
        for deny in policy.denies.iter().filter(in_scope) {
            match &deny.env {
                None => refused_by.push(deny),
                Some(names) => {
                    for name in names {
                        denied_names
                            .entry(name.clone())
                            .or_default()
                            .push(deny.id.clone());
                    }
                }
            }
        }
        let grants = policy
            .grants
            .iter()
            .filter(|g| {
                g.fleets.contains(fleet)
                    && host_admits(g.hosts.as_ref(), host)
                    && g.profiles.contains(profile)
            })
            .collect();
        View {
            profile: policy.profiles.get(profile),
            refused_by,
            denied_names,
            grants,
        }
    }

    fn allowed(&self) -> bool {
        self.profile.is_some_and(|p| p.max_instances > 0)
            && self.refused_by.is_empty()
            && !self.grants.is_empty()
    }

    /// The variables `grant` lets a request set here, and their rules.
    fn settable(&self, grant: &'a Grant) -> BTreeMap<&'a str, &'a EnvRule> {
        grant
            .env
            .iter()
            .filter(|(name, _)| {
                self.profile
                    .is_none_or(|p| !p.env.contains_key(*name) && !p.secrets.contains_key(*name))
                    && !self.denied_names.contains_key(*name)
                    && (names::dangerous(name).is_none() || grant.allow_dangerous.contains(*name))
            })
            .map(|(name, rule)| (name.as_str(), rule))
            .collect()
    }

    /// The rules that refuse the pair, for a reason.
    fn refusal(&self) -> (Vec<RuleId>, String) {
        if !self.refused_by.is_empty() {
            let ids = self.refused_by.iter().map(|d| d.id.clone()).collect();
            return (ids, "a deny rule refuses it".to_owned());
        }
        let why = match self.profile {
            None => "the profile does not exist",
            Some(p) if p.max_instances == 0 => "the profile allows no instance",
            Some(_) => "no grant admits it",
        };
        (vec![RuleId(DEFAULT_DENY.to_owned())], why.to_owned())
    }
}

/// A variable's values as written: pattern and length limit.
type Values = (String, usize);

/// Value languages by pattern and length, built once per diff.
#[derive(Default)]
struct Languages {
    built: HashMap<Values, Rc<Result<Language, LanguageError>>>,
    compared: HashMap<(Values, Values), Result<Change, LanguageError>>,
}

impl Languages {
    fn get(&mut self, rule: &EnvRule) -> Rc<Result<Language, LanguageError>> {
        let key = (rule.source.clone(), rule.max_len);
        Rc::clone(
            self.built
                .entry(key)
                .or_insert_with(|| Rc::new(Language::new(&rule.source, rule.max_len))),
        )
    }

    /// How the values of `old` compare with those of `new`; an uncomparable pattern counts as
    /// changed (fail closed), with the reason.
    fn compare(&mut self, old: &EnvRule, new: &EnvRule) -> Result<Change, LanguageError> {
        let key = (
            (old.source.clone(), old.max_len),
            (new.source.clone(), new.max_len),
        );
        if key.0 == key.1 {
            return Ok(Change::Same);
        }
        if let Some(known) = self.compared.get(&key) {
            return known.clone();
        }
        let result = match (&*self.get(old), &*self.get(new)) {
            (Ok(a), Ok(b)) => lang::compare(a, b),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        self.compared.insert(key, result.clone());
        result
    }

    fn example(&mut self, rule: &EnvRule) -> Option<String> {
        match &*self.get(rule) {
            Ok(language) => language.example().ok().flatten(),
            Err(_) => None,
        }
    }
}

fn compare_views(
    before: &View<'_>,
    after: &View<'_>,
    scope: &Scope,
    languages: &mut Languages,
    out: &mut Vec<Finding>,
) {
    match (before.allowed(), after.allowed()) {
        (false, false) => return,
        (false, true) => {
            let ids: Vec<RuleId> = after.grants.iter().map(|g| g.id.clone()).collect();
            let (_, was) = before.refusal();
            out.push(Finding {
                direction: Direction::Widened,
                scope: scope.clone(),
                subject: Subject::Access,
                message: format!("newly allowed by {} (before: {was})", grant_list(&ids)),
                rules: ids,
                example: None,
                holders: Vec::new(),
                location: after.grants.first().map(|g| g.location.clone()),
            });
        }
        (true, false) => {
            let (ids, why) = after.refusal();
            out.push(Finding {
                direction: Direction::Narrowed,
                scope: scope.clone(),
                subject: Subject::Access,
                message: format!("newly denied: {why}"),
                location: after.refused_by.first().map(|d| d.location.clone()),
                rules: ids,
                example: None,
                holders: Vec::new(),
            });
        }
        (true, true) => {}
    }
    // What each side's grants allow beyond the other's.
    for (from, to, direction) in [
        (before, after, Direction::Widened),
        (after, before, Direction::Narrowed),
    ] {
        if !to.allowed() {
            continue;
        }
        for grant in &to.grants {
            let covered = from.allowed()
                && from
                    .grants
                    .iter()
                    .any(|g| covers(languages, from, g, to, grant));
            if covered {
                continue;
            }
            let reference = from.allowed().then(|| closest(from, to, grant)).flatten();
            let (old_side, new_side) = match direction {
                Direction::Narrowed => ((to, Some(*grant)), (from, reference)),
                _ => ((from, reference), (to, Some(*grant))),
            };
            grant_findings(languages, old_side, new_side, direction, scope, out);
        }
    }
}

/// The grant of `from` to report `grant` of `to` against: the same id, else the one with most
/// settable variables in common.
fn closest<'a>(from: &View<'a>, to: &View<'_>, grant: &Grant) -> Option<&'a Grant> {
    if let Some(same) = from.grants.iter().find(|g| g.id == grant.id) {
        return Some(same);
    }
    let names: BTreeSet<&str> = to.settable(grant).into_keys().collect();
    from.grants
        .iter()
        .max_by_key(|g| {
            from.settable(g)
                .into_keys()
                .filter(|n| names.contains(n))
                .count()
        })
        .copied()
}

/// Whether `wide` (in `wide_view`) allows every request `narrow` (in `narrow_view`) allows, for
/// the same origin class and profile.
fn covers(
    languages: &mut Languages,
    wide_view: &View<'_>,
    wide: &Grant,
    narrow_view: &View<'_>,
    narrow: &Grant,
) -> bool {
    let wide_vars = wide_view.settable(wide);
    let vars_covered = narrow_view.settable(narrow).iter().all(|(name, rule)| {
        wide_vars.get(name).is_some_and(|w| {
            matches!(
                languages.compare(w, rule),
                Ok(Change::Same | Change::Narrowed { .. })
            )
        })
    });
    vars_covered
        && (!narrow.cwd || wide.cwd)
        && limit_within(narrow.max_concurrent, wide.max_concurrent)
        && rate_within(narrow.rate, wide.rate)
}

/// Whether limit `a` allows no more than `b` (`None`: no limit).
fn limit_within(a: Option<u32>, b: Option<u32>) -> bool {
    match (a, b) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a <= b,
    }
}

/// Whether rate `a` allows no more than `b`: no more requests, over no shorter a window.
fn rate_within(a: Option<Rate>, b: Option<Rate>) -> bool {
    match (a, b) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a.count <= b.count && a.per >= b.per,
    }
}

/// Findings for one grant against its reference: `old` and `new` are (view, grant) of each
/// side; `direction` says which side is the uncovered one (widened: `new`; narrowed: `old`).
fn grant_findings(
    languages: &mut Languages,
    (old_view, old): (&View<'_>, Option<&Grant>),
    (new_view, new): (&View<'_>, Option<&Grant>),
    direction: Direction,
    scope: &Scope,
    out: &mut Vec<Finding>,
) {
    let old_vars = old.map(|g| old_view.settable(g)).unwrap_or_default();
    let new_vars = new.map(|g| new_view.settable(g)).unwrap_or_default();
    // The uncovered grant names the finding; its location is NEW's when NEW has it.
    let subject_grant = if direction == Direction::Narrowed {
        old
    } else {
        new
    };
    let rules: Vec<RuleId> = subject_grant
        .map(|g| vec![g.id.clone()])
        .unwrap_or_default();
    let location = new.map(|g| g.location.clone());
    let by = subject_grant
        .map(|g| format!(" (grant `{}`)", g.id))
        .unwrap_or_default();
    // A variable's finding points at its pattern in NEW; the others at the grant.
    let mut push = |direction: Direction, subject: Subject, message: String, example| {
        let at = match &subject {
            Subject::Variable(name) => new_vars.get(name.as_str()).map(|r| r.location.clone()),
            _ => None,
        };
        out.push(Finding {
            direction,
            scope: scope.clone(),
            subject,
            message: format!("{message}{by}"),
            rules: rules.clone(),
            example,
            holders: Vec::new(),
            location: at.or_else(|| location.clone()),
        });
    };
    let names: BTreeSet<&str> = old_vars.keys().chain(new_vars.keys()).copied().collect();
    for name in names {
        let subject = Subject::Variable(name.to_owned());
        match (old_vars.get(name), new_vars.get(name)) {
            (None, Some(rule)) if direction.widens() => {
                let why = old_view
                    .denied_names
                    .get(name)
                    .map(|ids| format!(", no longer refused by {}", deny_list(ids)))
                    .unwrap_or_default();
                push(
                    Direction::Widened,
                    subject,
                    format!(
                        "`{name}` newly settable: `{}`, at most {} bytes{why}",
                        rule.source, rule.max_len
                    ),
                    languages.example(rule),
                );
            }
            (Some(rule), None) if direction == Direction::Narrowed => {
                let why = new_view
                    .denied_names
                    .get(name)
                    .map(|ids| format!(", now refused by {}", deny_list(ids)))
                    .unwrap_or_default();
                push(
                    Direction::Narrowed,
                    subject,
                    format!("`{name}` no longer settable{why}"),
                    languages.example(rule),
                );
            }
            (Some(before), Some(after)) => {
                let what = format!(
                    "`{name}`: `{}` ({} bytes) → `{}` ({} bytes)",
                    before.source, before.max_len, after.source, after.max_len
                );
                match languages.compare(before, after) {
                    Ok(Change::Same) => {}
                    Ok(Change::Widened { example }) if direction.widens() => push(
                        Direction::Widened,
                        subject,
                        format!("{what} admits more"),
                        Some(example),
                    ),
                    Ok(Change::Narrowed { example }) if direction == Direction::Narrowed => push(
                        Direction::Narrowed,
                        subject,
                        format!("{what} admits less"),
                        Some(example),
                    ),
                    Ok(Change::Changed { admitted, refused }) => push(
                        Direction::Changed,
                        subject,
                        format!("{what} admits other values (now refused, e.g. {refused:?})"),
                        Some(admitted),
                    ),
                    Err(reason) => push(
                        Direction::Changed,
                        subject,
                        format!("{what}: {reason}"),
                        None,
                    ),
                    Ok(_) => {}
                }
            }
            _ => {}
        }
    }
    let old_cwd = old.is_some_and(|g| g.cwd);
    let new_cwd = new.is_some_and(|g| g.cwd);
    if new_cwd && !old_cwd && direction.widens() {
        push(
            Direction::Widened,
            Subject::Cwd,
            "requests may now choose a working directory".to_owned(),
            None,
        );
    } else if old_cwd && !new_cwd && direction == Direction::Narrowed {
        push(
            Direction::Narrowed,
            Subject::Cwd,
            "requests may no longer choose a working directory".to_owned(),
            None,
        );
    }
    let (old_max, new_max) = (
        old.and_then(|g| g.max_concurrent),
        new.and_then(|g| g.max_concurrent),
    );
    let more = new.is_some() && (old.is_none() || !limit_within(new_max, old_max));
    let less = old.is_some() && (new.is_none() || !limit_within(old_max, new_max));
    if let Some(moved) = limit_change(direction, more, less) {
        let what = format!(
            "max_concurrent {} → {}",
            limit(old_max, old),
            limit(new_max, new)
        );
        push(moved, Subject::MaxConcurrent, what, None);
    }
    let (old_rate, new_rate) = (old.and_then(|g| g.rate), new.and_then(|g| g.rate));
    let more = new.is_some() && (old.is_none() || !rate_within(new_rate, old_rate));
    let less = old.is_some() && (new.is_none() || !rate_within(old_rate, new_rate));
    if let Some(moved) = limit_change(direction, more, less) {
        let what = format!("rate {} → {}", rate(old_rate, old), rate(new_rate, new));
        push(moved, Subject::Rate, what, None);
    }
}

/// How a limit that now allows `more` and/or `less` is reported in the pass for `pass`: the
/// widening pass reports one that allows more, the narrowing pass one that allows less, and
/// either one that does both as changed.
fn limit_change(pass: Direction, more: bool, less: bool) -> Option<Direction> {
    match (more, less) {
        (true, true) => Some(Direction::Changed),
        (true, false) if pass.widens() => Some(Direction::Widened),
        (false, true) if !pass.widens() => Some(Direction::Narrowed),
        _ => None,
    }
}

fn limit(value: Option<u32>, grant: Option<&Grant>) -> String {
    match (grant, value) {
        (None, _) => "(no grant)".to_owned(),
        (Some(_), None) => "unlimited".to_owned(),
        (Some(_), Some(n)) => n.to_string(),
    }
}

fn rate(value: Option<Rate>, grant: Option<&Grant>) -> String {
    match (grant, value) {
        (None, _) => "(no grant)".to_owned(),
        (Some(_), None) => "unlimited".to_owned(),
        (Some(_), Some(r)) => format!("{} per {} s", r.count, r.per.as_secs()),
    }
}

fn grant_list(ids: &[RuleId]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
    match quoted.len() {
        1 => format!("grant {}", quoted.join("")),
        _ => format!("grants {}", quoted.join(", ")),
    }
}

fn deny_list(ids: &[RuleId]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
    format!("deny {}", quoted.join(", "))
}

fn sender_name(sender: Sender) -> &'static str {
    match sender {
        Sender::Spawner => "spawner",
        Sender::Spawned => "spawned",
        Sender::Other => "other",
    }
}

fn compare_messages(
    old: &PolicySet,
    new: &PolicySet,
    fleet: &str,
    host: &Host,
    profile: &str,
    out: &mut Vec<Finding>,
) {
    // A fleet or host no rule names: a name outside every rule stands for the class.
    let fleet_name = if fleet == ANY { "\u{0}other" } else { fleet };
    let host_name = match host {
        Host::Named(name) => name.clone(),
        Host::Other => "\u{0}other".to_owned(),
    };
    for sender in [Sender::Other, Sender::Spawner, Sender::Spawned] {
        let request = MessageRequest {
            origin: Origin {
                fleet: fleet_name.to_owned(),
                host: host_name.clone(),
            },
            profile: profile.to_owned(),
            sender,
        };
        let before = evaluate_message(old, &request);
        let after = evaluate_message(new, &request);
        if before.effect == after.effect {
            continue;
        }
        let (direction, verb, decided) = match after.effect {
            Effect::Allow => (Direction::Widened, "now reach", &after),
            Effect::Deny => (Direction::Narrowed, "no longer reach", &after),
        };
        let location = new
            .messages
            .iter()
            .map(|m| (&m.id, &m.location))
            .chain(new.denies.iter().map(|d| (&d.id, &d.location)))
            .find(|(id, _)| decided.rules.contains(id))
            .map(|(_, l)| l.clone())
            .or_else(|| new.profiles.get(profile).map(|p| p.location.clone()));
        out.push(Finding {
            direction,
            scope: Scope {
                fleet: Some(fleet.to_owned()),
                host: Some(host.clone()),
                profile: profile.to_owned(),
            },
            subject: Subject::Message(sender_name(sender).to_owned()),
            message: format!(
                "messages from a sender that is `{}` {verb} its agents ({})",
                sender_name(sender),
                decided.reasons.join("; ")
            ),
            rules: decided.rules.clone(),
            example: None,
            holders: Vec::new(),
            location,
        });
    }
}

fn compare_profiles(before: &Profile, after: &Profile, holders: &[String], out: &mut Vec<Finding>) {
    let scope = Scope {
        fleet: None,
        host: None,
        profile: after.name.clone(),
    };
    let mut push = |direction: Direction, subject: Subject, message: String| {
        out.push(Finding {
            direction,
            scope: scope.clone(),
            subject,
            message,
            rules: Vec::new(),
            example: None,
            holders: holders.to_vec(),
            location: Some(after.location.clone()),
        });
    };
    if before.argv != after.argv {
        push(
            Direction::Changed,
            Subject::Argv,
            format!("argv {:?} → {:?}", before.argv, after.argv),
        );
    }
    let added = missing_from(&after.roots, &before.roots);
    let removed = missing_from(&before.roots, &after.roots);
    let first_root_moved = before.roots.first() != after.roots.first();
    match (added.is_empty(), removed.is_empty()) {
        (true, true) if !first_root_moved => {}
        (false, true) => push(
            Direction::Widened,
            Subject::Roots,
            format!("roots added: {}", added.join(", ")),
        ),
        (true, false) => push(
            Direction::Narrowed,
            Subject::Roots,
            format!("roots removed: {}", removed.join(", ")),
        ),
        _ => push(
            Direction::Changed,
            Subject::Roots,
            format!("roots {:?} → {:?}", before.roots, after.roots),
        ),
    }
    let names: BTreeSet<&String> = before.env.keys().chain(after.env.keys()).collect();
    for name in names {
        match (before.env.get(name), after.env.get(name)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => push(
                Direction::Changed,
                Subject::FixedEnv(name.clone()),
                format!(
                    "fixed `{name}`: {} → {}",
                    a.map_or("(unset)".to_owned(), |v| format!("{v:?}")),
                    b.map_or(
                        "(unset: requests may be granted it)".to_owned(),
                        |v| format!("{v:?}")
                    )
                ),
            ),
        }
    }
    let names: BTreeSet<&String> = before.secrets.keys().chain(after.secrets.keys()).collect();
    for name in names {
        match (before.secrets.get(name), after.secrets.get(name)) {
            (Some(a), Some(b)) if a == b => {}
            (None, Some(b)) => push(
                Direction::Widened,
                Subject::Secret(name.clone()),
                format!("secret `{name}` ({b}) newly handed to the profile"),
            ),
            (Some(a), None) => push(
                Direction::Narrowed,
                Subject::Secret(name.clone()),
                format!("secret `{name}` ({a}) no longer handed to the profile"),
            ),
            (a, b) => push(
                Direction::Changed,
                Subject::Secret(name.clone()),
                format!(
                    "secret `{name}` now from {} (was {})",
                    b.map(ToString::to_string).unwrap_or_default(),
                    a.map(ToString::to_string).unwrap_or_default()
                ),
            ),
        }
    }
    if before.max_instances != after.max_instances {
        let direction = if after.max_instances > before.max_instances {
            Direction::Widened
        } else {
            Direction::Narrowed
        };
        push(
            direction,
            Subject::MaxInstances,
            format!(
                "max_instances {} → {}",
                before.max_instances, after.max_instances
            ),
        );
    }
    let pattern = |p: &Profile| p.ready.pattern.as_ref().map(|r| r.as_str().to_owned());
    let input = |p: &Profile| p.ready.input.as_ref().map(|r| r.as_str().to_owned());
    if !before.ready.accept_dialogs && after.ready.accept_dialogs {
        push(
            Direction::Widened,
            Subject::Readiness,
            "startup dialogs are now accepted instead of reported".to_owned(),
        );
    } else if before.ready.accept_dialogs && !after.ready.accept_dialogs {
        push(
            Direction::Narrowed,
            Subject::Readiness,
            "startup dialogs are now reported instead of accepted".to_owned(),
        );
    } else if pattern(before) != pattern(after)
        || input(before) != input(after)
        || before.ready.timeout != after.ready.timeout
        || before.ready.settle != after.ready.settle
    {
        push(
            Direction::Changed,
            Subject::Readiness,
            format!(
                "readiness {:?} within {} s (settled {} s), input line {:?} → {:?} within {} s \
                 (settled {} s), input line {:?}",
                pattern(before),
                before.ready.timeout.as_secs(),
                before.ready.settle.as_secs(),
                input(before),
                pattern(after),
                after.ready.timeout.as_secs(),
                after.ready.settle.as_secs(),
                input(after)
            ),
        );
    }
    let spawn_added: Vec<&String> = after
        .may_spawn
        .iter()
        .filter(|p| !before.may_spawn.contains(p))
        .collect();
    let spawn_removed: Vec<&String> = before
        .may_spawn
        .iter()
        .filter(|p| !after.may_spawn.contains(p))
        .collect();
    if !spawn_added.is_empty() && !spawn_removed.is_empty() {
        push(
            Direction::Changed,
            Subject::MaySpawn,
            format!("may_spawn {:?} → {:?}", before.may_spawn, after.may_spawn),
        );
    } else if !spawn_added.is_empty() {
        push(
            Direction::Widened,
            Subject::MaySpawn,
            format!("its agents may now ask for {spawn_added:?}"),
        );
    } else if !spawn_removed.is_empty() {
        push(
            Direction::Narrowed,
            Subject::MaySpawn,
            format!("its agents may no longer ask for {spawn_removed:?}"),
        );
    }
    if before.remote_messages != after.remote_messages {
        let (direction, what) = if after.remote_messages {
            (Direction::Widened, "may now receive")
        } else {
            (Direction::Narrowed, "no longer receive")
        };
        push(
            direction,
            Subject::RemoteMessages,
            format!("its agents {what} text from other hosts"),
        );
    }
    for (direction, message) in sandbox_changes(&before.sandbox, &after.sandbox) {
        push(direction, Subject::Sandbox, message);
    }
}

/// The paths of `these` that `those` lacks, for people.
fn missing_from(these: &[std::path::PathBuf], those: &[std::path::PathBuf]) -> Vec<String> {
    these
        .iter()
        .filter(|p| !those.contains(p))
        .map(|p| p.display().to_string())
        .collect()
}

/// Each way the sandbox moved, widenings first.
fn sandbox_changes(before: &Sandbox, after: &Sandbox) -> Vec<(Direction, String)> {
    let (before, after) = match (before, after) {
        (Sandbox::Off, Sandbox::Off) => return Vec::new(),
        (Sandbox::On(_), Sandbox::Off) => {
            return vec![(
                Direction::Widened,
                "sandbox turned off: its agents now run unconfined, as their user".to_owned(),
            )];
        }
        (Sandbox::Off, Sandbox::On(_)) => {
            return vec![(
                Direction::Narrowed,
                "sandbox turned on: its agents now start confined".to_owned(),
            )];
        }
        (Sandbox::On(before), Sandbox::On(after)) => (before, after),
    };
    let mut out = Vec::new();
    if after.network != before.network {
        let direction = if after.network > before.network {
            Direction::Widened
        } else {
            Direction::Narrowed
        };
        out.push((
            direction,
            format!(
                "sandbox network {} → {}",
                before.network.as_str(),
                after.network.as_str()
            ),
        ));
    }
    if after.network == Network::Host && before.network == Network::Host {
        let ports =
            |p: &Option<Vec<u16>>| p.as_ref().map_or("any".to_owned(), |p| format!("{p:?}"));
        let direction = match (&before.tcp_connect, &after.tcp_connect) {
            (a, b) if a == b => None,
            (Some(_), None) => Some(Direction::Widened),
            (None, Some(_)) => Some(Direction::Narrowed),
            (Some(a), Some(b)) => {
                let more = b.iter().any(|p| !a.contains(p));
                let less = a.iter().any(|p| !b.contains(p));
                match (more, less) {
                    (true, true) => Some(Direction::Changed),
                    (true, false) => Some(Direction::Widened),
                    (false, true) => Some(Direction::Narrowed),
                    // The same ports in another order.
                    (false, false) => None,
                }
            }
            (None, None) => None,
        };
        if let Some(direction) = direction {
            out.push((
                direction,
                format!(
                    "sandbox TCP connect ports {} → {}",
                    ports(&before.tcp_connect),
                    ports(&after.tcp_connect)
                ),
            ));
        }
    }
    for (what, a, b) in [
        ("writable paths", &before.writable, &after.writable),
        ("hidden paths exposed", &before.readable, &after.readable),
    ] {
        let added = missing_from(b, a);
        let removed = missing_from(a, b);
        if !added.is_empty() {
            out.push((
                Direction::Widened,
                format!("sandbox {what} added: {}", added.join(", ")),
            ));
        }
        if !removed.is_empty() {
            out.push((
                Direction::Narrowed,
                format!("sandbox {what} removed: {}", removed.join(", ")),
            ));
        }
    }
    out.sort_by_key(|(direction, _)| *direction);
    out
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
