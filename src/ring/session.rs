//! Setting up a ring between two processes for the library: the session's handshake
//! (hello with the ring's spec, welcome), the verbs connection (`Prepared::connect`, as the
//! tests do), then the consumer's "ready" once its receives are posted.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use super::layout::RingConfig;
use super::transport::{Receiver, Record, Reservation, Sender};
use crate::error::{Error, Result};
use crate::link::wait::Woke;
use crate::link::{Link, Prepared, Role};
use crate::session::{Channel, Message, handshake};
use crate::spec::{Measure, Operation};
use crate::verbs::DeviceSelection;

/// The producing end of a ring, with its own connection (see the module docs).
pub struct Producer {
    tx: Sender<Link>,
    chan: Channel,
}

/// The consuming end of a ring, with its own connection (see the module docs).
pub struct Consumer {
    rx: Receiver<Link>,
    chan: RefCell<Channel>,
    /// Records the producer said it committed, once it has finished.
    finished: Cell<Option<u64>>,
}

impl Producer {
    /// Connects to a consumer listening on `host:port` (retrying up to `timeout`, so the
    /// consumer may start later) and sets up a ring of `config`. Every later wait is
    /// bounded by `timeout` too.
    pub fn connect(
        host: &str,
        port: u16,
        device: &DeviceSelection,
        config: RingConfig,
        timeout: Duration,
    ) -> Result<Producer> {
        config.check().map_err(Error::Usage)?;
        let spec = config.to_spec(Measure::Bandwidth);
        let prepared = Prepared::new(&spec, device)?;
        let mut chan = Channel::connect(host, port, timeout, timeout)?;
        handshake::open(&mut chan, &spec, None, None)?;
        let link = prepared.connect(Role::Client, &spec, &mut chan)?.remove(0);
        match chan.recv("the consumer to post its receives")? {
            Message::Ready { .. } => {}
            other => return Err(chan.unexpected(&other, "ready")),
        }
        Ok(Producer { tx: Sender::new(link, &config, timeout)?, chan })
    }

    /// Reserves `len` bytes in the staging ring, waiting for credit up to the timeout. A
    /// record larger than the ring is a usage error; no credit within the timeout (the
    /// consumer hung or died) is a peer error.
    pub fn reserve(&mut self, len: usize) -> Result<Reservation<'_, Link>> {
        self.tx.reserve(&mut self.chan, len)
    }

    /// Reserves `len` bytes if the ring has room now.
    pub fn try_reserve(&mut self, len: usize) -> Result<Option<Reservation<'_, Link>>> {
        self.tx.reserve_within(&mut self.chan, len, Duration::ZERO)
    }

    /// Reserves `len` bytes, waiting up to `wait` for credit; `None` if the ring stayed full.
    pub fn reserve_within(&mut self, len: usize, wait: Duration) -> Result<Option<Reservation<'_, Link>>> {
        self.tx.reserve_within(&mut self.chan, len, wait)
    }

    /// Sends every committed record now.
    pub fn flush(&mut self) -> Result<()> {
        self.tx.flush(&mut self.chan)
    }

    /// Largest record this ring carries.
    pub fn max_record(&self) -> usize {
        self.tx.max_record()
    }

    /// Records committed so far.
    pub fn records(&self) -> u64 {
        self.tx.records()
    }

    /// Flushes, waits until the consumer has released every record, then tells it the
    /// stream has ended (its `recv` returns `None` once it has read everything).
    pub fn finish(mut self) -> Result<()> {
        self.tx.drain(&mut self.chan)?;
        let records = self.tx.records();
        self.chan.send(&Message::Done { size: 0, iterations: records, per_qp: Vec::new() })
    }
}

impl Consumer {
    /// Waits up to `timeout` for a producer on TCP `port`; the ring's configuration is the
    /// producer's. Every later wait is bounded by `timeout` too.
    pub fn accept(port: u16, device: &DeviceSelection, timeout: Duration) -> Result<Consumer> {
        let mut chan = Channel::accept(port, timeout, timeout)?;
        let hello = handshake::opening(&mut chan, None, "the producer's hello")?;
        let (spec, config) = handshake::answer(&mut chan, &hello, &[], |s, _| {
            s.check()?;
            match (s.operation, RingConfig::from_spec(s)) {
                (Operation::Ring, Some(c)) => Ok((s.clone(), c)),
                _ => Err(Error::Usage(format!("the peer asked for a {} test, not a ring", s.name()))),
            }
        })?;
        let prepared = Prepared::new(&spec, device).inspect_err(|e| chan.abort(e))?;
        let link = prepared.connect(Role::Server, &spec, &mut chan)?.remove(0);
        let rx = Receiver::new(link, &config, timeout, chan.peer())?;
        // The receives were posted with the connection: the producer may write now.
        chan.send(&Message::Ready { size: 0 })?;
        Ok(Consumer { rx, chan: RefCell::new(chan), finished: Cell::new(None) })
    }

    /// The next record, waiting up to the timeout (a producer silent that long is an
    /// error); `None` once the producer has finished and every record was read.
    pub fn recv(&self) -> Result<Option<Record<'_, Link>>> {
        self.recv_with(None)
    }

    /// The next record if one has arrived.
    pub fn try_recv(&self) -> Result<Option<Record<'_, Link>>> {
        self.rx.try_recv()
    }

    /// The next record, waiting up to `wait`; `None` if none came (or the stream ended).
    pub fn recv_within(&self, wait: Duration) -> Result<Option<Record<'_, Link>>> {
        self.recv_with(Some(wait))
    }

    /// Records received so far.
    pub fn records(&self) -> u64 {
        self.rx.records()
    }

    fn recv_with(&self, wait: Option<Duration>) -> Result<Option<Record<'_, Link>>> {
        loop {
            if self.finished.get().is_some_and(|n| self.rx.records() >= n) {
                return Ok(None);
            }
            let mut chan = self.chan.borrow_mut();
            let (record, woke) = self.rx.recv(&mut chan, wait)?;
            if record.is_some() {
                return Ok(record);
            }
            match woke {
                // The producer says so only after every record it committed was released.
                Woke::Peer(Message::Done { iterations, .. }) => self.finished.set(Some(iterations)),
                Woke::Peer(other) => {
                    return Err(Error::Peer(format!(
                        "{} sent {} while this side waited for a record",
                        chan.peer(),
                        other.kind()
                    )));
                }
                Woke::Ready => return Ok(None), // `wait` passed
            }
        }
    }
}
