//! All-pairs fleet acceptance: which of N nodes, or which link between two of them, is
//! bad. `schedule` pairs every node with every other in rounds (circle method), `node`
//! runs one node (serving its partners, measuring its own pairs), `barrier` keeps the
//! nodes in step (node 0) and schedules retests, `attribution` fits the pairs' figures to
//! nodes and links, `output` writes the matrices, verdict, heat map and summary. The
//! Kubernetes Jobs (`k8s render --fleet all-pairs`) run one node per pod; the lab runs
//! one per simulated node on a bridge.

pub mod attribution;
pub mod barrier;
pub mod config;
pub mod node;
pub mod output;
pub mod schedule;
