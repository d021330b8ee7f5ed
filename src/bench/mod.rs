//! Measurements: the connected pair of resources it runs on
//! (`link`), the kernels (`latency`, `bandwidth`) with their shared waiting and
//! send-window logic (`wait`), payload patterns (`pattern`), and the client and server
//! roles that drive a run over the session (`runner`).

pub mod bandwidth;
pub mod latency;
pub mod link;
pub mod pattern;
pub mod ring;
pub mod runner;
pub mod wait;
