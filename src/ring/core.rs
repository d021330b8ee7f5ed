//! The ring's arithmetic, with no verbs in it: where records go, when they wrap, what the
//! producer may overwrite and what the consumer has read. The transport moves bytes and
//! credit words; everything it decides comes from here, so property tests of this module
//! cover the protocol.
//!
//! Positions are byte counts since the ring started (`u64`, never wrapping). The ring fills
//! from its end towards its start: the bytes at positions `[pos, pos + n)` lie at offsets
//! `[capacity - o - n, capacity - o)`, `o = pos & (capacity - 1)`. A record is
//! `payload [padding] [len: u32][tag: u32]`, `ALIGN`-aligned, never straddling the start
//! of the ring: a record that would is preceded by a pad record filling the rest of the lap.
//!
//! Why backwards: a record's frame word is its highest 8 bytes, the last byte an RDMA WRITE
//! places, and it sits right below the previous record, where the consumer knows to look.
//! One 8-byte word says both "this record has fully landed" and how long it is, so a
//! 64-byte payload travels as 72 bytes. (Growing upwards, the length must come first and a
//! second word last: 16 bytes of framing.)
//!
//! Records are numbered (`seq`, pads included) from 1; the number is not stored but mixed
//! with the kind (data or pad) and the length into the tag, a check that the frame word
//! belongs to the record the consumer expects. What makes polling safe is that no old
//! bytes are ever polled: a polling consumer clears what it released before returning its
//! credit (`ConsumerCore::publish`), so a frame word not yet written reads as zero, and it
//! never looks where the producer has no credit to write.

use std::collections::VecDeque;

pub use crate::spec::ring::{ALIGN, FRAME, MAX_CAPACITY, MIN_CAPACITY, check_capacity, max_record, span};

/// The tag's low two bits: what the record is. Neither is zero, so no frame word is.
const KIND_DATA: u32 = 1;
const KIND_PAD: u32 = 2;
const KIND_BITS: u32 = 3;

/// The tag of record `seq` of `kind` and `len`: the kind in the low bits, the rest a hash
/// of the three.
fn tag(kind: u32, seq: u64, len: u32) -> u32 {
    let m = (seq ^ (u64::from(len) << 32) ^ u64::from(kind).rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let m = (m ^ (m >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((m >> 32) as u32 & !KIND_BITS) | kind
}

fn frame_word(kind: u32, seq: u64, len: u32) -> u64 {
    u64::from(len) | (u64::from(tag(kind, seq, len)) << 32)
}

/// Where the bytes at positions `[pos, pos + n)` lie in a ring of `capacity` (they must not
/// cross a lap): the offset of the lowest.
fn offset_of(capacity: u64, pos: u64, n: u64) -> u64 {
    let o = pos & (capacity - 1);
    debug_assert!(o + n <= capacity, "{n} bytes at offset {o} cross the start of the ring");
    capacity - o - n
}

/// Where positions `[from, to)` (at most a ring's worth) lie: at most two ranges, split
/// where a lap ends (the first ends the lap at offset 0, the second starts the next at the
/// top), in position order.
fn ranges_of(capacity: u64, from: u64, to: u64) -> [Option<Range>; 2] {
    let mut out = [None, None];
    if from < to {
        let first = (to - from).min(capacity - (from & (capacity - 1)));
        out[0] = Some(Range { offset: offset_of(capacity, from, first), len: first });
        if first < to - from {
            let rest = to - from - first;
            out[1] = Some(Range { offset: offset_of(capacity, from + first, rest), len: rest });
        }
    }
    out
}

/// Reconstructs a full position from its low 32 bits, knowing it lies in
/// `[base - capacity, base + capacity]`.
fn widen(base: u64, low: u32) -> u64 {
    let diff = low.wrapping_sub(base as u32) as i32 as i64;
    (base as i64 + diff) as u64
}

/// Raw access to ring memory that the NIC may write at any time: every access is volatile
/// and bounds-checked. Built over registered memory by the transport, over a `Vec` in tests.
#[derive(Clone, Copy)]
pub struct RingMem {
    ptr: *mut u8,
    len: u64,
}

impl RingMem {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes while the value is used.
    pub unsafe fn new(ptr: *mut u8, len: u64) -> RingMem {
        RingMem { ptr, len }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ptr(&self, offset: u64, len: u64) -> *mut u8 {
        assert!(offset + len <= self.len, "ring access {offset}+{len} beyond {}", self.len);
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.add(offset as usize) }
    }

    pub fn load_u32(&self, offset: u64) -> u32 {
        // SAFETY: in bounds and 4-aligned (record fields are); volatile: the NIC writes it.
        unsafe { std::ptr::read_volatile(self.ptr(offset, 4).cast::<u32>()) }
    }

    pub fn load_u64(&self, offset: u64) -> u64 {
        // SAFETY: as load_u32, 8-aligned.
        unsafe { std::ptr::read_volatile(self.ptr(offset, 8).cast::<u64>()) }
    }

    pub fn store_u32(&self, offset: u64, v: u32) {
        // SAFETY: as load_u32.
        unsafe { std::ptr::write_volatile(self.ptr(offset, 4).cast::<u32>(), v) }
    }

    pub fn store_u64(&self, offset: u64, v: u64) {
        // SAFETY: as load_u64.
        unsafe { std::ptr::write_volatile(self.ptr(offset, 8).cast::<u64>(), v) }
    }
}

/// Why a reservation cannot be had now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// The ring lacks `need` free bytes until the consumer returns credit.
    Full { need: u64, free: u64 },
    /// The record can never fit.
    TooLarge { len: u64, max: u64 },
}

/// A reservation: the payload goes at `offset` (in the ring) for `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub offset: u64,
    pub len: u64,
    /// Where the record starts, as a position.
    start: u64,
    /// A pad record at this position first (the record wraps to the top of the ring).
    pad_at: Option<u64>,
}

/// A range of the ring to copy to the consumer: `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

/// The producer's view: what it has reserved, committed and sent, and what the consumer
/// has released (from the credit word).
#[derive(Debug)]
pub struct ProducerCore {
    capacity: u64,
    /// End of the committed records.
    committed: u64,
    /// End of what has been handed to the transport.
    sent: u64,
    /// The consumer's release position, as last read from the credit word.
    released: u64,
    /// Sequence number of the next record (pads count).
    next_seq: u64,
    /// Records committed since the last send.
    unsent_records: u64,
    reserved: Option<Reserved>,
}

impl ProducerCore {
    pub fn new(capacity: u64) -> ProducerCore {
        assert!(check_capacity(capacity).is_ok());
        ProducerCore { capacity, committed: 0, sent: 0, released: 0, next_seq: 1, unsent_records: 0, reserved: None }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes the producer may still fill before it needs credit.
    pub fn free(&self) -> u64 {
        self.capacity - (self.committed - self.released)
    }

    pub fn committed(&self) -> u64 {
        self.committed
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn released(&self) -> u64 {
        self.released
    }

    /// Records committed so far (pads not counted).
    pub fn unsent_records(&self) -> u64 {
        self.unsent_records
    }

    /// Finds room for a record of `len` bytes. The reservation stays until `commit` or
    /// `cancel`; reserving again replaces it.
    ///
    /// A record too big to share the ring with the pad before it (pad + record > capacity,
    /// e.g. one filling the whole ring while the producer is mid-ring) could never fit as
    /// one unit, so the pad is committed on its own first (written into `ring`, sent with
    /// the next write); the record then waits for the ring to drain up to it.
    pub fn reserve(&mut self, len: u64, ring: &RingMem) -> Result<Reserved, NoRoom> {
        let max = max_record(self.capacity);
        if len > max {
            return Err(NoRoom::TooLarge { len, max });
        }
        let sp = span(len);
        let offset = self.committed & (self.capacity - 1);
        let to_end = self.capacity - offset;
        if offset > 0 && sp > to_end && to_end + sp > self.capacity && to_end <= self.free() {
            self.write_record(ring, self.committed, KIND_PAD, to_end - FRAME);
            self.committed += to_end;
        }
        let offset = self.committed & (self.capacity - 1);
        let to_end = self.capacity - offset;
        let pad = if sp > to_end { to_end } else { 0 };
        let need = pad + sp;
        if need > self.free() {
            return Err(NoRoom::Full { need, free: self.free() });
        }
        let start = self.committed + pad;
        let r = Reserved {
            offset: offset_of(self.capacity, start, sp),
            len,
            start,
            pad_at: (pad > 0).then_some(self.committed),
        };
        self.reserved = Some(r);
        Ok(r)
    }

    pub fn cancel(&mut self) {
        self.reserved = None;
    }

    /// Commits the reservation: writes the pad (if any) and the record's frame word into
    /// `ring` (the staging ring); returns the record's sequence number.
    pub fn commit(&mut self, ring: &RingMem) -> u64 {
        let r = self.reserved.take().expect("commit without a reservation");
        if let Some(at) = r.pad_at {
            let pad_span = r.start - at;
            self.write_record(ring, at, KIND_PAD, pad_span - FRAME);
        }
        let seq = self.write_record(ring, r.start, KIND_DATA, r.len);
        self.committed = r.start + span(r.len);
        self.unsent_records += 1;
        seq
    }

    /// Writes the frame word of the record at `pos`: its first bytes as positions, the
    /// highest of its span as offsets.
    fn write_record(&mut self, ring: &RingMem, pos: u64, kind: u32, len: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        ring.store_u64(offset_of(self.capacity, pos, FRAME), frame_word(kind, seq, len as u32));
        seq
    }

    /// The committed bytes not yet sent, as at most two ranges (`ranges_of`), and marks
    /// them sent. Returns the end position the ranges reach.
    pub fn take_unsent(&mut self) -> ([Option<Range>; 2], u64) {
        let to = self.committed;
        let out = ranges_of(self.capacity, self.sent, to);
        self.sent = to;
        self.unsent_records = 0;
        (out, to)
    }

    /// Takes the consumer's release position from the credit word (its low 32 bits).
    /// Err when the value is impossible (beyond what was sent): a corrupted credit word.
    pub fn on_credit(&mut self, low: u32) -> Result<bool, String> {
        let pos = widen(self.sent, low);
        if pos > self.sent {
            return Err(format!(
                "the consumer's credit word says position {pos}, but only {} bytes were sent",
                self.sent
            ));
        }
        // A word behind what was already released is stale, not wrong: RC may execute a
        // retransmitted (duplicate) RDMA WRITE again, so an older credit word can land
        // after a newer one (seen in the lab under load, several rings back). The next
        // publication, which a blocked producer asks for, puts the word right.
        if pos > self.released {
            self.released = pos;
            return Ok(true);
        }
        Ok(false)
    }
}

/// A record handed to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef {
    /// Position of the record (its identity for `release`).
    pub pos: u64,
    /// Where its payload starts in the ring, and its length.
    pub offset: u64,
    pub len: u64,
    pub seq: u64,
}

/// How the consumer learns that records have landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The producer says how far its writes reach (`next`'s `landed`).
    Notified,
    /// The consumer polls frame words; it clears released space before returning it.
    Polled,
}

/// The consumer's view: what it has parsed, handed out and released, and what credit it
/// has published.
#[derive(Debug)]
pub struct ConsumerCore {
    capacity: u64,
    arrival: Arrival,
    /// Position of the next record to parse.
    read: u64,
    next_seq: u64,
    /// Everything before this is released (credit may be published up to it).
    released: u64,
    /// Credit given: the producer may write below `published + capacity`.
    published: u64,
    /// Records handed out and not yet all released, oldest first: (pos, span, released).
    out: VecDeque<(u64, u64, bool)>,
}

impl ConsumerCore {
    /// A consumer of a ring whose memory is all zero (as fresh registered memory is).
    pub fn new(capacity: u64, arrival: Arrival) -> ConsumerCore {
        assert!(check_capacity(capacity).is_ok());
        ConsumerCore { capacity, arrival, read: 0, next_seq: 1, released: 0, published: 0, out: VecDeque::new() }
    }

    pub fn read(&self) -> u64 {
        self.read
    }

    pub fn released(&self) -> u64 {
        self.released
    }

    /// Records handed out and not yet released.
    pub fn held(&self) -> usize {
        self.out.iter().filter(|r| !r.2).count()
    }

    /// Parses the next record in `ring`, if it has arrived. `landed`: when `Notified`, the
    /// position up to which data is known to be in memory (records before it must be
    /// complete); when `Polled`, `None`: the record's frame word, the last of its bytes to
    /// land, says whether it is there. Pads are skipped (and released) here.
    pub fn next(&mut self, ring: &RingMem, landed: Option<u64>) -> Result<Option<RecordRef>, String> {
        debug_assert_eq!(landed.is_some(), self.arrival == Arrival::Notified);
        loop {
            match landed {
                Some(l) if self.read >= l => return Ok(None),
                // Beyond the credit given, the memory still holds what the application
                // has not released (or not had cleared): nothing new can be there.
                None if self.read + FRAME > self.published + self.capacity => return Ok(None),
                _ => {}
            }
            let to_end = self.capacity - (self.read & (self.capacity - 1));
            let seq = self.next_seq;
            // One 8-byte read: length and tag from the same write.
            let frame = ring.load_u64(offset_of(self.capacity, self.read, FRAME));
            let (len32, tag_found) = (frame as u32, (frame >> 32) as u32);
            let kind = tag_found & KIND_BITS;
            let (len, sp) = (u64::from(len32), span(u64::from(len32)));
            if !(kind == KIND_DATA || kind == KIND_PAD) || sp > to_end || tag_found != tag(kind, seq, len32) {
                if landed.is_none() {
                    // Not arrived (cleared memory), or arriving: a copy may place the word
                    // a byte at a time. A word that stays wrong ends at the session deadline.
                    return Ok(None);
                }
                return Err(format!(
                    "record {seq} at position {}: its frame word {frame:#018x} (length {len}, kind {kind}) is not \
                     the record the producer sent",
                    self.read
                ));
            }
            // The frame word is the last of the record's bytes to land: the payload below
            // it is in memory too.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let pos = self.read;
            self.read += sp;
            self.next_seq += 1;
            if kind == KIND_PAD {
                self.out.push_back((pos, sp, true));
                self.advance();
                continue;
            }
            self.out.push_back((pos, sp, false));
            return Ok(Some(RecordRef { pos, offset: offset_of(self.capacity, pos, sp), len, seq }));
        }
    }

    /// Releases the record at `pos` (any order); credit advances past every released
    /// record at the front.
    pub fn release(&mut self, pos: u64) {
        let r = self.out.iter_mut().find(|r| r.0 == pos && !r.2).expect("release of a record not held");
        r.2 = true;
        self.advance();
    }

    fn advance(&mut self) {
        while let Some(&(pos, sp, true)) = self.out.front() {
            self.released = pos + sp;
            self.out.pop_front();
        }
    }

    /// Released bytes not yet published to the producer.
    pub fn unpublished(&self) -> u64 {
        self.released - self.published
    }

    /// Whether to publish credit now: a quarter of the ring is waiting to be returned, or
    /// the producer asked and there is something to give.
    pub fn credit_due(&self, producer_asked: bool) -> bool {
        let waiting = self.unpublished();
        waiting >= self.capacity / 4 || (producer_asked && waiting > 0)
    }

    /// Marks the credit published; returns the word's value (low 32 bits of the position).
    /// `Polled`: first clears the space being returned in `ring`, so that a frame word the
    /// producer has not written yet reads as zero.
    pub fn publish(&mut self, ring: &RingMem) -> u32 {
        if self.arrival == Arrival::Polled {
            for r in ranges_of(self.capacity, self.published, self.released).into_iter().flatten() {
                // SAFETY: inside the ring (`ptr` checks); released, so nothing reads it and
                // the producer writes it only after this credit arrives.
                unsafe { std::ptr::write_bytes(ring.ptr(r.offset, r.len), 0, r.len as usize) };
            }
            // The zeros are in memory before the credit word can go out.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        }
        self.published = self.released;
        self.released as u32
    }

    /// Takes a notification: the producer's end position in its low 32 bits.
    pub fn widen_landed(&self, low: u32) -> u64 {
        widen(self.read, low)
    }
}

#[cfg(test)]
mod tests;
