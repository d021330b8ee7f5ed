//! Perf history for CI: every run kept in a store (an SQLite file, or PostgreSQL for many
//! hosts), each figure a point in a series of its setup, change points found in each
//! series (E-divisive means with a permutation test), a regression named with what changed
//! in the environment at its run, and the series drawn with the change points marked.
//!
//! May use `report` (run documents, plots) and the base layer; nothing that moves bytes.

pub mod changepoint;
pub mod check;
pub mod command;
pub mod model;
mod postgres;
pub mod store;
