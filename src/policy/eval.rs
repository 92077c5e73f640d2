//! The decision: pure, deny by default, a matching deny beats any grant, and every decision
//! names the rules that made it.

use std::collections::BTreeSet;
use std::time::Duration;

use super::model::{Deny, Grant, PolicySet, Profile, RuleId};
use super::names;
use super::request::{Origin, Request};

/// Allow or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// Launch.
    Allow,
    /// Refuse.
    Deny,
}

/// The outcome, the rules that decided it, and reasons a person can read.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    /// Allow or deny.
    pub effect: Effect,
    /// The deciding rules (`default-deny` when nothing matched).
    pub rules: Vec<RuleId>,
    /// Why, one line each; never a request value.
    pub reasons: Vec<String>,
}

/// The rule id of a refusal no rule made.
pub const DEFAULT_DENY: &str = "default-deny";

/// What is running and what was asked recently: the state limits are checked against.
pub trait Usage {
    /// Instances of `profile` running on this host.
    fn running(&self, profile: &str) -> u32;
    /// Instances `fleet` runs through `grant`.
    fn running_through(&self, grant: &RuleId, fleet: &str) -> u32;
    /// Requests `fleet` made through `grant` within `window`.
    fn recent_through(&self, grant: &RuleId, fleet: &str, window: Duration) -> u32;
}

/// Fixed counts (for `policy explain`, `policy test` and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    /// Instances of the requested profile running.
    #[serde(default)]
    pub running: u32,
    /// Instances the origin fleet runs through the grant.
    #[serde(default)]
    pub origin_running: u32,
    /// Requests the origin fleet made through the grant within its window.
    #[serde(default)]
    pub recent: u32,
}

impl Usage for Counts {
    fn running(&self, _profile: &str) -> u32 {
        self.running
    }
    fn running_through(&self, _grant: &RuleId, _fleet: &str) -> u32 {
        self.origin_running
    }
    fn recent_through(&self, _grant: &RuleId, _fleet: &str, _window: Duration) -> u32 {
        self.recent
    }
}

/// Decides `request` against `policy` given `usage`.
pub fn evaluate(policy: &PolicySet, request: &Request, usage: &dyn Usage) -> Decision {
    if let Some(denied) = denied(policy, "request", |d| deny_matches(d, request)) {
        return denied;
    }
    let Some(profile) = policy.profiles.get(&request.profile) else {
        return default_deny(format!("this host has no profile `{}`", request.profile));
    };
    let candidates: Vec<&Grant> = policy
        .grants
        .iter()
        .filter(|g| grant_admits(g, request))
        .collect();
    if candidates.is_empty() {
        return default_deny(format!(
            "no grant admits origin `{}` for profile `{}`",
            request.origin, request.profile
        ));
    }
    let mut reasons = Vec::new();
    for grant in &candidates {
        match check_grant(grant, profile, request, usage) {
            Ok(()) => {
                return Decision {
                    effect: Effect::Allow,
                    rules: vec![grant.id.clone()],
                    reasons: vec![format!(
                        "grant `{}` admits origin `{}` for profile `{}`",
                        grant.id, request.origin, request.profile
                    )],
                };
            }
            Err(reason) => reasons.push(format!("grant `{}`: {reason}", grant.id)),
        }
    }
    Decision {
        effect: Effect::Deny,
        rules: candidates.iter().map(|g| g.id.clone()).collect(),
        reasons,
    }
}

fn default_deny(reason: String) -> Decision {
    Decision {
        effect: Effect::Deny,
        rules: vec![RuleId(DEFAULT_DENY.to_owned())],
        reasons: vec![reason],
    }
}

/// A deny decision citing every deny rule of `policy` that `matches`, if any; `what` names the
/// thing refused in a reason without a description.
pub(super) fn denied(
    policy: &PolicySet,
    what: &str,
    matches: impl Fn(&Deny) -> bool,
) -> Option<Decision> {
    let denies: Vec<&Deny> = policy.denies.iter().filter(|d| matches(d)).collect();
    (!denies.is_empty()).then(|| Decision {
        effect: Effect::Deny,
        rules: denies.iter().map(|d| d.id.clone()).collect(),
        reasons: denies
            .iter()
            .map(|d| match &d.description {
                Some(why) => format!("deny `{}`: {why}", d.id),
                None => format!("deny `{}` matches this {what}", d.id),
            })
            .collect(),
    })
}

/// Whether `deny`'s fleets, hosts and profiles take `origin` and `profile` (its `env` aside).
pub(super) fn deny_scope_matches(deny: &Deny, origin: &Origin, profile: &str) -> bool {
    let within = |set: &Option<std::collections::BTreeSet<String>>, item: &str| {
        set.as_ref().is_none_or(|s| s.contains(item))
    };
    within(&deny.fleets, &origin.fleet)
        && within(&deny.hosts, &origin.host)
        && within(&deny.profiles, profile)
}

fn deny_matches(deny: &Deny, request: &Request) -> bool {
    deny_scope_matches(deny, &request.origin, &request.profile)
        && deny
            .env
            .as_ref()
            .is_none_or(|names| request.env.keys().any(|k| names.contains(k)))
}

fn grant_admits(grant: &Grant, request: &Request) -> bool {
    grant.fleets.contains(&request.origin.fleet)
        && grant
            .hosts
            .as_ref()
            .is_none_or(|h| h.contains(&request.origin.host))
        && grant.profiles.contains(&request.profile)
}

/// Why a grant that names the origin and profile does not admit a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantRefusal {
    /// The request sets a variable the profile fixes.
    #[error("`{name}` is fixed by profile `{profile}`")]
    Fixed {
        /// The variable.
        name: String,
        /// The profile.
        profile: String,
    },
    /// The request sets a dangerous variable the grant does not opt in to.
    #[error("`{name}` is a dangerous variable (matches `{pattern}`) and the grant does not opt in")]
    Dangerous {
        /// The variable.
        name: String,
        /// The dangerous pattern it matches.
        pattern: String,
    },
    /// The grant does not let requests set this variable.
    #[error("`{0}` may not be set")]
    NotAllowed(String),
    /// The value is longer than the grant allows.
    #[error("the value of `{name}` is longer than {max_len} bytes")]
    TooLong {
        /// The variable.
        name: String,
        /// The grant's limit.
        max_len: usize,
    },
    /// The value does not match the grant's pattern.
    #[error("the value of `{name}` does not match `{pattern}`")]
    Mismatch {
        /// The variable.
        name: String,
        /// The grant's pattern, as written.
        pattern: String,
    },
    /// The request names a working directory and the grant does not allow it.
    #[error("the grant does not let requests choose a working directory")]
    Cwd,
    /// The profile runs its `max_instances` already.
    #[error("profile `{profile}` already runs {running} of {max} instances")]
    Instances {
        /// The profile.
        profile: String,
        /// How many run.
        running: u32,
        /// Its `max_instances`.
        max: u32,
    },
    /// The origin's fleet runs the grant's `max_concurrent` already.
    #[error("fleet `{fleet}` already runs {running} of {max} instances through it")]
    Concurrent {
        /// The origin's fleet.
        fleet: String,
        /// How many it runs through the grant.
        running: u32,
        /// The grant's `max_concurrent`.
        max: u32,
    },
    /// The origin's fleet asked more often than the grant's `rate`.
    #[error("rate limit: {count} requests per {per_secs} s")]
    Rate {
        /// Requests allowed per window.
        count: u32,
        /// The window, seconds.
        per_secs: u64,
    },
}

fn check_grant(
    grant: &Grant,
    profile: &Profile,
    request: &Request,
    usage: &dyn Usage,
) -> Result<(), GrantRefusal> {
    for (name, value) in &request.env {
        if profile.env.contains_key(name) || profile.secrets.contains_key(name) {
            return Err(GrantRefusal::Fixed {
                name: name.clone(),
                profile: profile.name.clone(),
            });
        }
        if let Some(pattern) = names::dangerous(name)
            && !grant.allow_dangerous.contains(name)
        {
            return Err(GrantRefusal::Dangerous {
                name: name.clone(),
                pattern: pattern.to_string(),
            });
        }
        let Some(rule) = grant.env.get(name) else {
            return Err(GrantRefusal::NotAllowed(name.clone()));
        };
        if value.len() > rule.max_len {
            return Err(GrantRefusal::TooLong {
                name: name.clone(),
                max_len: rule.max_len,
            });
        }
        if !rule.pattern.is_match(value) {
            return Err(GrantRefusal::Mismatch {
                name: name.clone(),
                pattern: rule.source.to_string(),
            });
        }
    }
    if request.cwd.is_some() && !grant.cwd {
        return Err(GrantRefusal::Cwd);
    }
    let running = usage.running(&profile.name);
    if running >= profile.max_instances {
        return Err(GrantRefusal::Instances {
            profile: profile.name.clone(),
            running,
            max: profile.max_instances,
        });
    }
    if let Some(max) = grant.max_concurrent {
        let mine = usage.running_through(&grant.id, &request.origin.fleet);
        if mine >= max {
            return Err(GrantRefusal::Concurrent {
                fleet: request.origin.fleet.clone(),
                running: mine,
                max,
            });
        }
    }
    if let Some(rate) = grant.rate {
        let recent = usage.recent_through(&grant.id, &request.origin.fleet, rate.per);
        if recent >= rate.count {
            return Err(GrantRefusal::Rate {
                count: rate.count,
                per_secs: rate.per.as_secs(),
            });
        }
    }
    Ok(())
}

/// Whether `deny` refuses every request `grant` could allow (the grant can never match).
pub(super) fn deny_covers(deny: &Deny, grant: &Grant) -> bool {
    deny_covers_scope(deny, &grant.fleets, grant.hosts.as_ref(), &grant.profiles)
}

/// Whether `deny` (without `env`) takes every origin and profile of a rule scoped by `fleets`,
/// `hosts` (`None`: any) and `profiles`.
pub(super) fn deny_covers_scope(
    deny: &Deny,
    fleets: &BTreeSet<String>,
    hosts: Option<&BTreeSet<String>>,
    profiles: &BTreeSet<String>,
) -> bool {
    let covers = |set: &Option<BTreeSet<String>>, items: &BTreeSet<String>| {
        set.as_ref().is_none_or(|s| items.is_subset(s))
    };
    deny.env.is_none()
        && covers(&deny.fleets, fleets)
        && covers(&deny.profiles, profiles)
        && match (&deny.hosts, hosts) {
            (None, _) => true,
            (Some(denied), Some(hosts)) => hosts.is_subset(denied),
            (Some(_), None) => false,
        }
}
