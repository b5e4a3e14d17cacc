//! The agent: a language model that proposes edits of a kernel template, which then go
//! through the same gate, compile, check, timing and revert path as every candidate.
//! [`client`] talks to an OpenAI-compatible chat endpoint, [`prompt`] builds what is
//! sent, [`edits`] parses and applies the reply's search/replace blocks, [`anticheat`]
//! refuses edits that could cheat before anything is compiled, and [`limits`] keeps
//! requests, tokens and cost within the run's allowance. Depends on [`crate::spec`] only;
//! the stage that drives it is `engine/agent_stage.rs`.

pub mod anticheat;
pub mod client;
pub mod edits;
pub mod limits;
pub mod prompt;
