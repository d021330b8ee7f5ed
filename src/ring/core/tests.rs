//! The ring's protocol, simulated: a producer and a consumer core over two byte arrays, a
//! "wire" that copies committed ranges from the staging ring to the consumer's ring (in
//! address order, possibly a part at a time, when the test says), and a credit word that
//! reaches the producer late. Random record sizes, flushes, deliveries, consumption and
//! release orders, across many wraps.

use super::*;
use proptest::prelude::*;

struct Sim {
    capacity: u64,
    staging: Vec<u8>,
    ring: Vec<u8>,
    p: ProducerCore,
    c: ConsumerCore,
    /// Sent, not yet landed: (range, end position the range completes); the front may be
    /// partly delivered (`delivered` bytes of it).
    wire: VecDeque<(Range, u64)>,
    delivered: u64,
    /// With notifications: position up to which data has landed, as the imm would say.
    imm: bool,
    landed: u64,
    /// Credit word in flight to the producer.
    credit: Option<u32>,
    produced: u64,
    consumed: u64,
    /// Records held by the application: (record, record number).
    held: Vec<(RecordRef, u64)>,
    asked: bool,
}

fn payload_byte(record: u64, i: u64) -> u8 {
    (record.wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) % 251) as u8
}

impl Sim {
    fn new(capacity: u64, imm: bool) -> Sim {
        Sim {
            capacity,
            staging: vec![0; capacity as usize],
            ring: vec![0; capacity as usize],
            p: ProducerCore::new(capacity),
            c: ConsumerCore::new(capacity, if imm { Arrival::Notified } else { Arrival::Polled }),
            wire: VecDeque::new(),
            delivered: 0,
            imm,
            landed: 0,
            credit: None,
            produced: 0,
            consumed: 0,
            held: Vec::new(),
            asked: false,
        }
    }

    fn staging(&mut self) -> RingMem {
        // SAFETY: the Vec outlives every use within one call.
        unsafe { RingMem::new(self.staging.as_mut_ptr(), self.capacity) }
    }

    fn ring(&mut self) -> RingMem {
        // SAFETY: as above.
        unsafe { RingMem::new(self.ring.as_mut_ptr(), self.capacity) }
    }

    /// Tries to produce a record of `len`; false when the ring is full.
    fn produce(&mut self, len: u64) -> bool {
        let mem = self.staging();
        match self.p.reserve(len, &mem) {
            Ok(r) => {
                for i in 0..len {
                    self.staging[(r.offset + i) as usize] = payload_byte(self.produced, i);
                }
                self.p.commit(&mem);
                self.produced += 1;
                true
            }
            Err(NoRoom::Full { need, free }) => {
                assert!(need > free);
                self.asked = true; // the transport would ask the consumer for credit
                false
            }
            Err(NoRoom::TooLarge { .. }) => panic!("sizes are drawn below the maximum"),
        }
    }

    fn flush(&mut self) {
        let (ranges, end) = self.p.take_unsent();
        let ranges: Vec<Range> = ranges.into_iter().flatten().collect();
        let n = ranges.len();
        for (k, r) in ranges.into_iter().enumerate() {
            // Only the last write of a flush carries the notification.
            self.wire.push_back((r, if k + 1 == n { end } else { u64::MAX }));
        }
    }

    /// Copies up to `bytes` from the staging ring to the consumer's ring, in order.
    fn deliver(&mut self, mut bytes: u64) {
        while bytes > 0 {
            let Some(&(r, end)) = self.wire.front() else { return };
            let n = bytes.min(r.len - self.delivered);
            let from = (r.offset + self.delivered) as usize;
            self.ring[from..from + n as usize].copy_from_slice(&self.staging[from..from + n as usize]);
            self.delivered += n;
            bytes -= n;
            if self.delivered == r.len {
                self.wire.pop_front();
                self.delivered = 0;
                if end != u64::MAX {
                    self.landed = self.c.widen_landed(end as u32);
                    assert_eq!(self.landed, end);
                }
            }
        }
    }

    fn consume(&mut self) -> bool {
        let landed = self.imm.then_some(self.landed);
        let mem = self.ring();
        match self.c.next(&mem, landed).expect("no corruption") {
            Some(rec) => {
                for i in 0..rec.len {
                    assert_eq!(
                        self.ring[(rec.offset + i) as usize],
                        payload_byte(self.consumed, i),
                        "record {} byte {i} (of {}) at offset {}",
                        self.consumed,
                        rec.len,
                        rec.offset
                    );
                }
                self.held.push((rec, self.consumed));
                self.consumed += 1;
                true
            }
            None => {
                if self.c.credit_due(self.asked) {
                    self.publish();
                }
                false
            }
        }
    }

    fn release(&mut self, pick: usize) {
        if self.held.is_empty() {
            return;
        }
        let (rec, number) = self.held.remove(pick % self.held.len());
        // Nothing overwrote it while it was held.
        for i in 0..rec.len {
            assert_eq!(self.ring[(rec.offset + i) as usize], payload_byte(number, i), "record {number} overwritten");
        }
        self.c.release(rec.pos);
        if self.c.credit_due(self.asked) {
            self.publish();
        }
    }

    fn publish(&mut self) {
        let mem = self.ring();
        let (released, returned) = (self.c.released(), self.c.unpublished());
        self.credit = Some(self.c.publish(&mem));
        self.asked = false;
        if !self.imm {
            // A polling consumer clears what it returns: where the producer may write next,
            // no stale frame word is left to be taken for a record.
            for pos in released - returned..released {
                assert_eq!(self.ring[offset_of(self.capacity, pos, 1) as usize], 0, "position {pos} not cleared");
            }
        }
    }

    fn credit_arrives(&mut self) {
        if let Some(w) = self.credit.take() {
            self.p.on_credit(w).expect("a valid credit word");
        }
        assert!(self.p.committed() - self.p.released() <= self.capacity, "credit beyond capacity");
        assert!(self.c.released() <= self.c.read());
    }

    /// Delivers, consumes and releases everything; every record arrives exactly once.
    fn drain(&mut self) {
        self.flush();
        self.deliver(u64::MAX);
        while self.consume() {}
        while !self.held.is_empty() {
            self.release(0);
        }
        self.publish();
        self.credit_arrives();
        assert_eq!(self.consumed, self.produced, "records lost or duplicated");
        assert_eq!(self.p.free(), self.capacity, "all credit returned");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Produce(u64),
    Flush,
    Deliver(u64),
    Consume,
    Release(usize),
    Credit,
}

fn ops(max_len: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => prop_oneof![0..64u64, 0..1024u64, 0..=max_len].prop_map(Op::Produce),
        2 => Just(Op::Flush),
        3 => (1..4096u64).prop_map(Op::Deliver),
        3 => Just(Op::Consume),
        3 => any::<usize>().prop_map(Op::Release),
        2 => Just(Op::Credit),
    ];
    prop::collection::vec(op, 1..600)
}

fn run(capacity: u64, imm: bool, ops: Vec<Op>) {
    let mut s = Sim::new(capacity, imm);
    for op in ops {
        match op {
            Op::Produce(len) => {
                s.produce(len);
            }
            Op::Flush => s.flush(),
            Op::Deliver(n) => s.deliver(n),
            Op::Consume => {
                s.consume();
            }
            Op::Release(k) => s.release(k),
            Op::Credit => s.credit_arrives(),
        }
        assert!(s.p.committed() - s.p.released() <= capacity);
    }
    s.drain();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn polled_records_arrive_once_in_order_and_unharmed(ops in ops(max_record(4096))) {
        run(4096, false, ops);
    }

    #[test]
    fn notified_records_arrive_once_in_order_and_unharmed(ops in ops(max_record(8192))) {
        run(8192, true, ops);
    }
}

/// Many wraps: a long stream of random sizes through a small ring, the consumer holding a
/// few records and releasing them out of order.
#[test]
fn a_long_stream_wraps_many_times() {
    let mut s = Sim::new(4096, false);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    while s.produced < 20_000 {
        let len = if rand(10) == 0 { rand(max_record(4096) + 1) } else { rand(200) };
        while !s.produce(len) {
            s.flush();
            s.deliver(rand(5000) + 1);
            while s.consume() {}
            if s.held.len() > 3 || rand(2) == 0 {
                let k = rand(s.held.len() as u64 + 1) as usize;
                s.release(k);
            }
            s.credit_arrives();
        }
    }
    s.drain();
    assert!(s.p.committed() / 4096 > 100, "wrapped {} times", s.p.committed() / 4096);
}

/// A record filling the whole ring, asked for mid-ring: it cannot share the ring with the
/// pad before it, so the pad goes alone, and the record fits once that pad is consumed.
#[test]
fn a_record_filling_the_ring_fits_from_mid_ring_after_a_lone_pad() {
    let mut s = Sim::new(4096, false);
    assert!(s.produce(100));
    s.drain();
    assert!(!s.produce(max_record(4096)), "must wait for the pad to be consumed");
    s.drain();
    assert_eq!(s.p.committed() % 4096, 0, "the pad took the producer to the ring's start");
    assert!(s.produce(max_record(4096)));
    s.drain();
    assert_eq!(s.consumed, 2);
}

#[test]
fn a_record_of_exactly_the_free_space_fits_and_one_byte_more_waits() {
    let mut s = Sim::new(4096, true);
    assert!(s.produce(1000));
    let free = s.p.free();
    // The rest of the ring up to the end, as one record.
    let len = free - FRAME;
    assert_eq!(span(len), free);
    assert!(s.produce(len));
    assert_eq!(s.p.free(), 0);
    assert!(!s.produce(0), "a full ring refuses even an empty record");
    s.drain();
    // Now the whole ring is free but its end is at offset 1024 + free...: a full-ring
    // record needs offset 0. After the drain the producer sits at offset 0 again.
    assert_eq!(s.p.committed() % 4096, 0);
    assert!(s.produce(max_record(4096)), "a record filling the whole ring");
    let mem = s.staging();
    assert!(matches!(s.p.reserve(max_record(4096) + 1, &mem), Err(NoRoom::TooLarge { max: 4088, .. })));
    s.drain();
}

#[test]
fn a_record_that_does_not_fit_before_the_end_pads_and_wraps() {
    let mut s = Sim::new(4096, false);
    assert!(s.produce(3000));
    assert_eq!(span(3000), 3008, "3000 B and the 8 B frame word, 8-aligned");
    s.drain();
    // The ring fills downwards: 1088 bytes are left at the bottom; 2000 does not fit
    // there: a pad of 1088 ends the lap, and the record starts the next at the top.
    assert!(s.produce(2000));
    let (ranges, end) = s.p.take_unsent();
    assert_eq!(ranges[0], Some(Range { offset: 0, len: 1088 }));
    assert_eq!(ranges[1], Some(Range { offset: 4096 - span(2000), len: span(2000) }));
    assert_eq!(end, 4096 + span(2000));
}

#[test]
fn credit_words_wrap_at_32_bits_and_bad_ones_are_refused() {
    let mut p = ProducerCore::new(1 << 20);
    // Pretend 5 GiB went through: positions beyond 32 bits.
    p.committed = 5 << 30;
    p.sent = 5 << 30;
    p.released = (5 << 30) - 4096;
    assert_eq!(p.on_credit(((5u64 << 30) - 100) as u32), Ok(true));
    assert_eq!(p.released(), (5 << 30) - 100);
    assert!(p.on_credit(((5u64 << 30) + 8) as u32).is_err(), "beyond what was sent");
    // An older word landing again (a re-executed duplicate write) changes nothing.
    assert_eq!(p.on_credit(((5u64 << 30) - (2 << 20)) as u32), Ok(false), "stale, several rings back");
    assert_eq!(p.released(), (5 << 30) - 100);
}

#[test]
fn records_fill_the_ring_downwards_with_the_frame_word_on_top() {
    let mut s = Sim::new(4096, false);
    assert!(s.produce(100));
    let (ranges, _) = s.p.take_unsent();
    assert_eq!(ranges[0], Some(Range { offset: 4096 - 112, len: 112 }));
    let frame = u64::from_le_bytes(s.staging[4088..4096].try_into().unwrap());
    assert_eq!(frame as u32, 100, "the length, in the ring's highest word");
    assert_eq!(frame >> 32 & 3, 1, "a data record");
}

#[test]
fn a_polling_consumer_clears_what_it_returns() {
    let mut s = Sim::new(4096, false);
    for len in [100, 3000, 2000, 7] {
        assert!(s.produce(len));
        s.drain();
    }
    assert!(s.p.committed() > 4096, "wrapped");
    assert!(s.ring.iter().all(|&b| b == 0), "every released byte cleared");
}

#[test]
fn a_frame_word_with_another_number_is_not_the_record() {
    let mut s = Sim::new(4096, false);
    assert!(s.produce(100));
    s.flush();
    s.deliver(u64::MAX);
    // Record 1's frame word where record 2's goes (a protocol fault): polling waits on...
    let first = s.ring[4088..4096].to_vec();
    s.ring[4088 - 112..4096 - 112].copy_from_slice(&first);
    let mem = s.ring();
    assert!(s.c.next(&mem, None).unwrap().is_some());
    assert_eq!(s.c.next(&mem, None), Ok(None));
    // ...and announced by an immediate, the same bytes are corruption.
    let mut n = ConsumerCore::new(4096, Arrival::Notified);
    assert!(n.next(&mem, Some(224)).unwrap().is_some());
    assert!(n.next(&mem, Some(224)).unwrap_err().contains("not the record the producer sent"));
}

#[test]
fn the_consumer_does_not_look_where_the_producer_has_no_credit() {
    let mut s = Sim::new(4096, false);
    // Fill the ring exactly and hold every record: the producer has no credit left.
    for _ in 0..4 {
        assert!(s.produce(1024 - FRAME));
    }
    s.flush();
    s.deliver(u64::MAX);
    while s.consume() {}
    assert_eq!(s.c.read(), 4096);
    // A well-formed frame word for the next record where it would go (over the held
    // first record's): the consumer must not read it, the producer could not have sent it.
    let word = frame_word(KIND_DATA, 5, 0);
    s.ring[4088..4096].copy_from_slice(&word.to_le_bytes());
    let mem = s.ring();
    assert_eq!(s.c.next(&mem, None), Ok(None));
}

#[test]
fn capacities_must_be_powers_of_two_in_range() {
    assert!(check_capacity(4096).is_ok());
    assert!(check_capacity(1 << 30).is_ok());
    for bad in [0, 100, 2048, 6000, 1 << 31] {
        assert!(check_capacity(bad).unwrap_err().contains("power of two"), "{bad}");
    }
}
