//! Workloads: suites of steps from `workloads/*.toml` (`file`), the figures they are
//! judged on (`metrics`), the document of a run (`doc`) and the run itself (`run`).

pub mod file;
pub mod run;
#[cfg(test)]
mod tests;
