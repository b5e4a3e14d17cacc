//! What to try next: the strategy [`plan`] (ordered stages, each a template, a knob
//! space and a search kind), the [`search`] that proposes knob values within a stage,
//! and the [`diagnose`] step that reads the incumbents' symptoms to decide whether a
//! stage with `when` runs. Depends only on [`crate::spec`].

pub mod diagnose;
pub mod plan;
pub mod search;
