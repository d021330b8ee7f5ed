//! The ring's arithmetic, with no verbs in it: where records go, when they wrap, what the
//! producer may overwrite and what the consumer has read. The transport moves bytes and
//! credit words; everything it decides comes from here, so property tests of this module
//! cover the protocol.
//!
//! Positions are byte counts since the ring started (`u64`, never wrapping); a position's
//! offset in the ring is `pos & (capacity - 1)`. A record is
//! `[len: u32][tag: u32] payload [padding] [check: u64]`, `ALIGN`-aligned, never straddling
//! the end: a record that would is preceded by a pad record filling the rest of the ring.
//! Records are numbered (`seq`, pads included) from 1; the number is not stored but mixed
//! into the tag (with the kind, data or pad, and the length) and into the 64-bit check, so
//! zeroed memory and stale bytes of an older lap do not pass for the record the consumer
//! expects. The header is 8 bytes and the alignment 16 so a small record costs little on
//! the wire (a 64-byte payload travels as 80 bytes).

use std::collections::VecDeque;

/// Header bytes before a record's payload.
pub const HEADER: u64 = 8;
/// The check word, the last 8 bytes of a record's span.
pub const TRAILER: u64 = 8;
/// Records start at multiples of this; the space left before the end is always one, and
/// holds at least an empty pad record (header and check).
pub const ALIGN: u64 = 16;
/// Smallest ring: room for one aligned record and a pad.
pub const MIN_CAPACITY: u64 = 4096;
/// Largest ring: positions travel as 32-bit numbers, whose differences must stay unambiguous.
pub const MAX_CAPACITY: u64 = 1 << 30;

const KIND_DATA: u32 = 1;
const KIND_PAD: u32 = 2;

fn mix(seq: u64, len: u32) -> u64 {
    (seq ^ (u64::from(len) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The header's tag for a record `kind` with this `seq` and `len`.
fn tag(kind: u32, seq: u64, len: u32) -> u32 {
    kind ^ (mix(seq, len) >> 32) as u32
}

/// The record's last word: `seq`, `len` and `kind` mixed again (differently from the tag).
fn check_word(kind: u32, seq: u64, len: u32) -> u64 {
    let m = mix(seq, len) ^ u64::from(kind).rotate_left(17);
    (m ^ (m >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1
}

/// Bytes a record of `len` payload bytes occupies in the ring.
pub fn span(len: u64) -> u64 {
    (HEADER + len + TRAILER).next_multiple_of(ALIGN)
}

/// The largest payload a ring of `capacity` bytes carries (one record filling it).
pub fn max_record(capacity: u64) -> u64 {
    capacity.saturating_sub(HEADER + TRAILER)
}

/// Checks a capacity: a power of two within the limits.
pub fn check_capacity(capacity: u64) -> Result<(), String> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        let nearest = capacity.checked_next_power_of_two().unwrap_or(MAX_CAPACITY).clamp(MIN_CAPACITY, MAX_CAPACITY);
        return Err(format!(
            "ring capacity {capacity} B is not a power of two from {MIN_CAPACITY} B to {} MiB; use --capacity \
             {nearest}",
            MAX_CAPACITY >> 20
        ));
    }
    Ok(())
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
    /// Where the record (header) starts, as a position.
    start: u64,
    /// A pad record at this position first (the record wraps to offset 0).
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
            self.write_record(ring, self.committed, KIND_PAD, to_end - HEADER - TRAILER, to_end);
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
            offset: (start & (self.capacity - 1)) + HEADER,
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

    /// Commits the reservation: writes the pad (if any) and the record's header and
    /// check word into `ring` (the staging ring); returns the record's sequence number.
    pub fn commit(&mut self, ring: &RingMem) -> u64 {
        let r = self.reserved.take().expect("commit without a reservation");
        if let Some(at) = r.pad_at {
            let pad_span = r.start - at;
            self.write_record(ring, at, KIND_PAD, pad_span - HEADER - TRAILER, pad_span);
        }
        let seq = self.write_record(ring, r.start, KIND_DATA, r.len, span(r.len));
        self.committed = r.start + span(r.len);
        self.unsent_records += 1;
        seq
    }

    fn write_record(&mut self, ring: &RingMem, pos: u64, kind: u32, len: u64, span: u64) -> u64 {
        let off = pos & (self.capacity - 1);
        let seq = self.next_seq;
        self.next_seq += 1;
        let header = u64::from(len as u32) | (u64::from(tag(kind, seq, len as u32)) << 32);
        ring.store_u64(off, header);
        ring.store_u64(off + span - TRAILER, check_word(kind, seq, len as u32));
        seq
    }

    /// The committed bytes not yet sent, as at most two ranges (split at the end of the
    /// ring), and marks them sent. Returns the end position the ranges reach.
    pub fn take_unsent(&mut self) -> ([Option<Range>; 2], u64) {
        let mut out = [None, None];
        let (from, to) = (self.sent, self.committed);
        if from < to {
            let off = from & (self.capacity - 1);
            let first = (to - from).min(self.capacity - off);
            out[0] = Some(Range { offset: off, len: first });
            if first < to - from {
                out[1] = Some(Range { offset: 0, len: to - from - first });
            }
        }
        self.sent = to;
        self.unsent_records = 0;
        (out, to)
    }

    /// Takes the consumer's release position from the credit word (its low 32 bits).
    /// Err when the value is impossible (beyond what was sent): a corrupted credit word.
    pub fn on_credit(&mut self, low: u32) -> Result<bool, String> {
        let pos = widen(self.sent, low);
        if pos > self.sent || self.sent - pos > self.capacity {
            return Err(format!(
                "the consumer's credit word says position {pos}, but {} bytes were sent and the ring holds {}",
                self.sent, self.capacity
            ));
        }
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
    /// Position of the record's header (its identity for `release`).
    pub pos: u64,
    /// Where its payload starts in the ring, and its length.
    pub offset: u64,
    pub len: u64,
    pub seq: u64,
}

/// The consumer's view: what it has parsed, handed out and released, and what credit it
/// has published.
#[derive(Debug)]
pub struct ConsumerCore {
    capacity: u64,
    /// Position of the next record to parse.
    read: u64,
    next_seq: u64,
    /// Everything before this is released (credit may be published up to it).
    released: u64,
    published: u64,
    /// Records handed out and not yet all released, oldest first: (pos, span, released).
    out: VecDeque<(u64, u64, bool)>,
}

impl ConsumerCore {
    pub fn new(capacity: u64) -> ConsumerCore {
        assert!(check_capacity(capacity).is_ok());
        ConsumerCore { capacity, read: 0, next_seq: 1, released: 0, published: 0, out: VecDeque::new() }
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

    /// Parses the next record in `ring`, if it has arrived. `landed`: with notifications
    /// (`imm`), the position up to which data is known to be in memory (records before it
    /// must be complete); without (`poll`), `None`: the record's header and check word say
    /// whether it has fully landed. Pads are skipped (and released) here.
    pub fn next(&mut self, ring: &RingMem, landed: Option<u64>) -> Result<Option<RecordRef>, String> {
        loop {
            if landed.is_some_and(|l| self.read >= l) {
                return Ok(None);
            }
            let off = self.read & (self.capacity - 1);
            let seq = self.next_seq;
            // One 8-byte read: length and tag from the same write.
            let header = ring.load_u64(off);
            let len32 = header as u32;
            let kind = (header >> 32) as u32 ^ tag(0, seq, len32);
            let len = u64::from(len32);
            let to_end = self.capacity - off;
            let sp = span(len);
            if !(kind == KIND_DATA || kind == KIND_PAD) || sp > to_end {
                if landed.is_none() {
                    return Ok(None); // not arrived yet (what is there is older)
                }
                return Err(format!(
                    "record {seq} at offset {off}: the header (length {len}, kind {kind}) is not the record the \
                     producer announced"
                ));
            }
            if ring.load_u64(off + sp - TRAILER) != check_word(kind, seq, len32) {
                if landed.is_none() {
                    return Ok(None); // header landed, the rest of the record not yet
                }
                return Err(format!("record {seq} at offset {off}: its check word does not match its header"));
            }
            // Header and check matched: the payload between them is in memory too.
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
            return Ok(Some(RecordRef { pos, offset: off + HEADER, len, seq }));
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
    pub fn publish(&mut self) -> u32 {
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
