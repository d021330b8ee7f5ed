//! The control channel between client and server: framed, length-bounded messages over
//! TCP, a versioned handshake, barriers and deadlines, and peer-loss detection.
//! It carries the spec, the endpoints and the results; it never touches verbs.

pub mod auth;
pub mod channel;
pub mod door;
pub mod frame;
pub mod handshake;
pub mod open_files;
pub mod proto;

pub use channel::{Channel, Listener, PeerPoll};
pub use door::Door;
pub use proto::{Message, PROTOCOL_VERSION, RailHello};
