//! Terminal panes: what fleetd types into them.
//!
//! For now this holds the pane-safe text sanitiser; the `Multiplexer` trait with its tmux and
//! herdr backends arrives with the spawn issue.
//!
//! Imports: nothing from the crate (a leaf).

pub mod sanitize;
