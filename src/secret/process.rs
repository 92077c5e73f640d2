//! Process hygiene for a secret-holding process: no core dumps, no same-user ptrace.

/// Why the process could not be hardened.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error("cannot mark the process non-dumpable")]
    Dumpable(#[source] std::io::Error),
    /// `setrlimit(RLIMIT_CORE, 0)` failed.
    #[error("cannot set the core-dump size limit to 0")]
    CoreLimit(#[source] std::io::Error),
}

/// Makes the process non-dumpable (its `/proc/<pid>` files become root-owned, same-user ptrace
/// is refused) and sets `RLIMIT_CORE` to 0. Call after environment secrets were taken.
#[cfg(target_os = "linux")]
pub fn harden_process() -> Result<(), HardenError> {
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};

    no_core_dumps()?;
    set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|e| HardenError::Dumpable(e.into()))
}

/// Sets `RLIMIT_CORE` to 0 (there is no dumpable flag outside Linux).
#[cfg(not(target_os = "linux"))]
pub fn harden_process() -> Result<(), HardenError> {
    no_core_dumps()
}

fn no_core_dumps() -> Result<(), HardenError> {
    use rustix::process::{Resource, Rlimit, setrlimit};

    let zero = Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    setrlimit(Resource::Core, zero).map_err(|e| HardenError::CoreLimit(e.into()))
}
/// What the kernel reports after [`harden_process`]: `(dumpable, core_limit)`.
#[cfg(target_os = "linux")]
pub fn hardening_state() -> (bool, Option<u64>) {
    use rustix::process::{DumpableBehavior, Resource, dumpable_behavior, getrlimit};

    let dumpable = !matches!(dumpable_behavior(), Ok(DumpableBehavior::NotDumpable));
    (dumpable, getrlimit(Resource::Core).current)
}

/// What the kernel reports after [`harden_process`]: `(dumpable, core_limit)`.
#[cfg(not(target_os = "linux"))]
pub fn hardening_state() -> (bool, Option<u64>) {
    use rustix::process::{Resource, getrlimit};

    (true, getrlimit(Resource::Core).current)
}
