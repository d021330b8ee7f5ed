//! What every decoder's property shares: the cases to run, inputs mutated from real
//! documents, an allocator that counts each thread's peak, and the checks every decoding
//! must pass (no panic, memory bounded by the input, a refusal that is a clear error).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per decoder: a few thousand in `cargo test`; `RDMABENCH_DECODER_CASES=1000000`
/// for the long run (docs/development.md).
pub fn cases() -> u32 {
    std::env::var("RDMABENCH_DECODER_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

// ---- Memory: each thread's live bytes and their peak ----

pub struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(n);
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn shrank(n: usize) {
    // Freed memory may have been allocated on another thread: never below zero.
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

/// `f`'s result and the most memory it held at once beyond what was live before it.
fn peak_of<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let r = f();
    (r, PEAK.with(Cell::get).saturating_sub(before))
}

/// What a decoder may hold for an input of `len` bytes: a parsed tree is some tens of
/// bytes per input byte (a JSON value is 32 bytes for a 2-byte `0,`), plus a fixed
/// allowance for buffers and tables. Memory that follows a number in the input (a
/// length, a count) instead of its size breaks this.
pub fn memory_bound(len: usize) -> usize {
    64 * len + (8 << 20)
}

// ---- Inputs: real documents, mutated ----

/// Text that breaks decoders: limits of numbers, escapes, structure, huge runs.
const TOKENS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e308",
    "1e309",
    "-1e309",
    "0.0000000000000000001",
    "NaN",
    "inf",
    "nan",
    "null",
    "true",
    "\"\"",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\u{1b}[31m",
    "\u{202e}",
    "\u{2028}",
    "\0",
    "\r",
    "\n",
    "\r\n",
    "\"",
    "'",
    "'''",
    "\"\"\"",
    "\\",
    "=",
    ",",
    ":",
    "#",
    "[[step]]\n",
    "[params]\n",
    "[measure]\n",
    "[thresholds]\n",
    "RDMABENCH_PAIR ",
    "RDMABENCH_SERVED ",
    "RDMABENCH_LEFT ",
    "RDMABENCH_RESULT ",
    "[pod/x/rdmabench] ",
    "2026-12-07T10:00:00.000000000Z ",
    "rdmabench/run",
    "rdmabench/result",
];

/// One change to a document.
#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(Index, u8),
    Delete(Index, usize),
    Truncate(Index),
    /// A span of the document copied elsewhere in it (a duplicated field, line or row).
    Splice(Index, usize, Index),
    /// A token inserted.
    Insert(Index, &'static str),
    /// The number at or after a place replaced by a token (`"size": 65536` becomes
    /// `"size": 18446744073709551616`).
    Number(Index, &'static str),
    /// A long run of one text: a huge string, a deep nesting.
    Run(Index, &'static str, usize),
}

/// One change of a document.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let token = proptest::sample::select(TOKENS);
    let run = proptest::sample::select(&["a", "[", "{\"a\":", "[[", "9", "\\\\", "é"][..]);
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), 1usize..256, any::<Index>()).prop_map(|(a, n, b)| Mutation::Splice(a, n, b)),
        3 => (any::<Index>(), token.clone()).prop_map(|(i, t)| Mutation::Insert(i, t)),
        4 => (any::<Index>(), token).prop_map(|(i, t)| Mutation::Number(i, t)),
        1 => (any::<Index>(), run, prop_oneof![Just(200usize), Just(5_000), Just(70_000)])
            .prop_map(|(i, t, n)| Mutation::Run(i, t, n)),
    ]
}

impl Mutation {
    pub fn apply(&self, doc: &mut Vec<u8>) {
        let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
        match self {
            Mutation::Flip(i, b) if !doc.is_empty() => {
                let k = i.index(doc.len());
                doc[k] ^= b | 1;
            }
            Mutation::Flip(..) => {}
            Mutation::Delete(i, n) => {
                let k = at(i, doc.len());
                let end = (k + n).min(doc.len());
                doc.drain(k..end);
            }
            Mutation::Truncate(i) => {
                let k = at(i, doc.len());
                doc.truncate(k);
            }
            Mutation::Splice(a, n, b) => {
                let k = at(a, doc.len());
                let span: Vec<u8> = doc[k..(k + n).min(doc.len())].to_vec();
                let to = at(b, doc.len());
                doc.splice(to..to, span);
            }
            Mutation::Insert(i, t) => {
                let k = at(i, doc.len());
                doc.splice(k..k, t.bytes());
            }
            Mutation::Number(i, t) => {
                let from = at(i, doc.len());
                if let Some(start) = doc[from..].iter().position(u8::is_ascii_digit).map(|p| p + from) {
                    let end = doc[start..]
                        .iter()
                        .position(|c| !c.is_ascii_digit() && *c != b'.')
                        .map_or(doc.len(), |p| p + start);
                    doc.splice(start..end, t.bytes());
                }
            }
            Mutation::Run(i, t, n) => {
                let k = at(i, doc.len());
                doc.splice(k..k, t.repeat(*n).into_bytes());
            }
        }
    }
}

/// A document from `seeds`, with up to `most` mutations.
pub fn mutated(seeds: Vec<Vec<u8>>, most: usize) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty());
    (0..seeds.len(), proptest::collection::vec(mutation(), 0..=most)).prop_map(move |(k, changes)| {
        let mut doc = seeds[k].clone();
        for m in &changes {
            m.apply(&mut doc);
        }
        doc
    })
}

/// Bytes from nowhere.
pub fn noise() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..2048)
}

// ---- The checks and the tally ----

/// A refusal a user can act on: said in words, on a bounded number of lines, and with no
/// character that would restyle a terminal or forge a log line.
pub fn clear_error(decoder: &str, message: &str) -> Result<(), String> {
    if message.trim().is_empty() {
        return Err(format!("{decoder}: an empty error"));
    }
    if message.len() > 16 << 10 {
        return Err(format!("{decoder}: an error of {} bytes: {}...", message.len(), &message[..200]));
    }
    if let Some(c) =
        message.chars().find(|c| (c.is_control() && *c != '\n' && *c != '\t') || ('\u{202a}'..='\u{202e}').contains(c))
    {
        return Err(format!("{decoder}: the error carries {c:?}: {message:?}"));
    }
    Ok(())
}

/// Runs `decode` on `cases()` inputs of `strategy`: it must not panic, must hold at most
/// `memory_bound` of the input's size, and must refuse with a clear error (`Err`). Prints
/// what happened: cases, accepted and refused, the worst memory, the rate.
pub fn property<S>(decoder: &str, strategy: S, decode: impl Fn(&S::Value) -> (usize, Result<(), String>))
where
    S: Strategy,
    S::Value: Debug,
{
    let config = Config { cases: cases(), failure_persistence: None, max_shrink_iters: 2_000, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let (accepted, refused, worst) = (Cell::new(0u64), Cell::new(0u64), Cell::new((0usize, 0usize)));
    let started = Instant::now();
    let result = runner.run(&strategy, |input| {
        let ((len, outcome), peak) = peak_of(|| decode(&input));
        if peak > memory_bound(len) {
            return Err(TestCaseError::fail(format!(
                "{decoder}: held {peak} bytes for an input of {len} (bound {})",
                memory_bound(len)
            )));
        }
        if peak > worst.get().0 {
            worst.set((peak, len));
        }
        match outcome {
            Ok(()) => accepted.set(accepted.get() + 1),
            Err(why) => {
                clear_error(decoder, &why).map_err(TestCaseError::fail)?;
                refused.set(refused.get() + 1);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{decoder}: {e}");
    }
    let secs = started.elapsed().as_secs_f64();
    let (peak, len) = worst.get();
    // stdout: the long run shows it with --nocapture while the decoders' own warnings on
    // stderr go elsewhere.
    println!(
        "decoder {decoder}: {} cases in {secs:.1} s ({:.0}/s): {} accepted, {} refused with a clear error; \
         no panic; most memory held {} KiB (for an input of {} bytes)",
        accepted.get() + refused.get(),
        (accepted.get() + refused.get()) as f64 / secs,
        accepted.get(),
        refused.get(),
        peak >> 10,
        len
    );
}
