//! What to try next: the strategy [`plan`] (ordered stages, each a template, a knob
//! space and a search kind), the [`search`] that proposes knob values within a stage,
//! the [`diagnose`] step that reads the incumbents' symptoms to decide whether a
//! stage with `when` runs, and the [`open`]-ended phase after the plan (a search per
//! class of shapes until the budget is spent or every class converged). Depends only
//! on [`crate::spec`].

pub mod diagnose;
pub mod open;
pub mod plan;
pub mod search;
