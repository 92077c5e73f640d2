//! The decision: pure, deny by default, a matching deny beats any grant, and every decision
//! names the rules that made it.

use std::time::Duration;

use super::model::{Deny, Grant, PolicySet, Profile, RuleId};
use super::names;
use super::request::Request;

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
    let denies: Vec<&Deny> = policy
        .denies
        .iter()
        .filter(|d| deny_matches(d, request))
        .collect();
    if !denies.is_empty() {
        return Decision {
            effect: Effect::Deny,
            rules: denies.iter().map(|d| d.id.clone()).collect(),
            reasons: denies
                .iter()
                .map(|d| match &d.description {
                    Some(why) => format!("deny `{}`: {why}", d.id),
                    None => format!("deny `{}` matches this request", d.id),
                })
                .collect(),
        };
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

fn deny_matches(deny: &Deny, request: &Request) -> bool {
    let within = |set: &Option<std::collections::BTreeSet<String>>, item: &str| {
        set.as_ref().is_none_or(|s| s.contains(item))
    };
    within(&deny.fleets, &request.origin.fleet)
        && within(&deny.hosts, &request.origin.host)
        && within(&deny.profiles, &request.profile)
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

fn check_grant(
    grant: &Grant,
    profile: &Profile,
    request: &Request,
    usage: &dyn Usage,
) -> Result<(), String> {
    for (name, value) in &request.env {
        if profile.env.contains_key(name) || profile.secrets.contains_key(name) {
            return Err(format!("`{name}` is fixed by profile `{}`", profile.name));
        }
        if let Some(pattern) = names::dangerous(name)
            && !grant.allow_dangerous.contains(name)
        {
            return Err(format!(
                "`{name}` is a dangerous variable (matches `{pattern}`) and the grant does not opt in"
            ));
        }
        let Some(rule) = grant.env.get(name) else {
            return Err(format!("`{name}` may not be set"));
        };
        if value.len() > rule.max_len {
            return Err(format!(
                "the value of `{name}` is longer than {} bytes",
                rule.max_len
            ));
        }
        if !rule.pattern.is_match(value) {
            return Err(format!(
                "the value of `{name}` does not match `{}`",
                rule.source
            ));
        }
    }
    if request.cwd.is_some() && !grant.cwd {
        return Err("the grant does not let requests choose a working directory".to_owned());
    }
    let running = usage.running(&profile.name);
    if running >= profile.max_instances {
        return Err(format!(
            "profile `{}` already runs {running} of {} instances",
            profile.name, profile.max_instances
        ));
    }
    if let Some(max) = grant.max_concurrent {
        let mine = usage.running_through(&grant.id, &request.origin.fleet);
        if mine >= max {
            return Err(format!(
                "fleet `{}` already runs {mine} of {max} instances through it",
                request.origin.fleet
            ));
        }
    }
    if let Some(rate) = grant.rate {
        let recent = usage.recent_through(&grant.id, &request.origin.fleet, rate.per);
        if recent >= rate.count {
            return Err(format!(
                "rate limit: {} requests per {} s",
                rate.count,
                rate.per.as_secs()
            ));
        }
    }
    Ok(())
}

/// Whether `deny` refuses every request `grant` could allow (the grant can never match).
pub(super) fn deny_covers(deny: &Deny, grant: &Grant) -> bool {
    let covers = |set: &Option<std::collections::BTreeSet<String>>,
                  items: &std::collections::BTreeSet<String>| {
        set.as_ref().is_none_or(|s| items.is_subset(s))
    };
    deny.env.is_none()
        && covers(&deny.fleets, &grant.fleets)
        && covers(&deny.profiles, &grant.profiles)
        && match (&deny.hosts, &grant.hosts) {
            (None, _) => true,
            (Some(denied), Some(hosts)) => hosts.is_subset(denied),
            (Some(_), None) => false,
        }
}
