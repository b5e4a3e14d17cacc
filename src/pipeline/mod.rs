//! A candidate's life, one module per stage: [`render`] -> [`gate`] -> [`compile`] ->
//! [`check`] -> ([`screen`]) -> [`timing`] -> [`decide`] -> [`record`], each returning an
//! [`outcome`]. The stages are sequenced by [`crate::engine`]; the GPU work goes
//! through [`crate::daemon::supervisor`], and [`record`] builds the ledger's rows.
//! Depends on [`crate::spec`], [`crate::daemon`] and [`crate::storage`].

pub mod check;
pub mod compile;
pub mod decide;
pub mod gate;
pub mod outcome;
pub mod record;
pub mod render;
pub mod screen;
pub mod timing;
