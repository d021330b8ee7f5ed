//! The fleet's round barrier, kept by node 0: every node joins it over the control
//! channel (greeting, token proof, the plan's fingerprint), then, step by step, says it
//! is ready (with the pairs it measured in the step before) and waits for the word to
//! begin. A step begins when every live node has arrived; a node whose connection ends,
//! or that does not arrive within the step's deadline, has left the fleet: the others go
//! on without it and the pairs it could not report are recorded as failed.
//!
//! After the planned steps the coordinator judges what it has and schedules the retests:
//! each suspect node against a known-good peer, each suspect link again, in steps where
//! no node is in two pairs. Nodes trust nothing of each other here: rows are bounded and
//! must be the sender's own, and a message out of turn ends that node's membership.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::attribution::{self, Observation, Thresholds};
use super::schedule::{Pair, Step};
use crate::error::{Error, Result};
use crate::report::pairs::PairRow;
use crate::session::{Channel, Door, Message, PeerPoll};

/// How often the coordinator sweeps its nodes' channels while a step runs.
const SWEEP: Duration = Duration::from_millis(5);

pub struct Coordinator {
    pub door: Door,
    pub nodes: u32,
    /// The plan's fingerprint (`Plan` as JSON): a node with another plan is refused.
    pub fingerprint: String,
    pub steps: Vec<Step>,
    /// How long the nodes have to join.
    pub join_timeout: Duration,
    /// How long one step may take, from its `Go` to the last node's arrival.
    pub step_timeout: Duration,
    pub thresholds: Thresholds,
}

/// What the coordinator saw: every row, and which nodes left and why.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rows: Vec<PairRow>,
    pub dead: BTreeMap<u32, String>,
}

impl Coordinator {
    pub fn run(self) -> Result<Outcome> {
        let n = self.nodes as usize;
        let mut chans: Vec<Option<Channel>> = (0..n).map(|_| None).collect();
        let mut out = Outcome::default();
        self.gather(&mut chans);
        for (i, c) in chans.iter().enumerate() {
            if c.is_none() {
                out.dead.insert(i as u32, format!("never joined within {:.0} s", self.join_timeout.as_secs_f64()));
            }
        }
        let planned = self.steps.len() as u32;
        let mut retests: Option<Vec<Vec<Pair>>> = None;
        let mut step = 0u32;
        loop {
            self.arrivals(step, &mut chans, &mut out);
            if step > 0 {
                let before = self.pairs_of(step - 1, retests.as_deref());
                let round = self.steps.get(step as usize - 1).map_or(0, |s| s.round);
                fill_missing(step - 1, round, step > planned, &before, &mut out);
            }
            let (retest, done) = if step < planned {
                (Vec::new(), false)
            } else {
                let r = retests.get_or_insert_with(|| retest_steps(self.nodes, &out, &self.thresholds));
                match r.get((step - planned) as usize) {
                    Some(pairs) => (pairs.iter().map(|p| [p.client, p.server]).collect(), false),
                    None => (Vec::new(), true),
                }
            };
            let go = Message::Go { step, dead: out.dead.keys().copied().collect(), retest, done };
            for (i, slot) in chans.iter_mut().enumerate() {
                if let Some(c) = slot
                    && let Err(e) = c.send(&go)
                {
                    out.dead.insert(i as u32, format!("lost at step {step}: {e}"));
                    *slot = None;
                }
            }
            if done {
                return Ok(out);
            }
            step += 1;
        }
    }

    /// The pairs of step `step`: planned, or the retests after them.
    fn pairs_of(&self, step: u32, retests: Option<&[Vec<Pair>]>) -> Vec<Pair> {
        match self.steps.get(step as usize) {
            Some(s) => s.pairs.clone(),
            None => retests.and_then(|r| r.get(step as usize - self.steps.len())).cloned().unwrap_or_default(),
        }
    }

    /// Takes joins until every node is in or the join deadline passes.
    fn gather(&self, chans: &mut [Option<Channel>]) {
        let deadline = Instant::now() + self.join_timeout;
        while chans.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.door.next(left) {
                Ok((mut chan, Message::Join { node, nodes, plan, .. })) => {
                    let why = if nodes != self.nodes || plan != self.fingerprint {
                        Some(format!(
                            "its plan ({nodes} nodes, {plan}) is not this fleet's ({}, {})",
                            self.nodes, self.fingerprint
                        ))
                    } else if node >= self.nodes {
                        Some(format!("node {node} is no node of a fleet of {}", self.nodes))
                    } else if chans[node as usize].is_some() {
                        Some(format!("node {node} has joined already"))
                    } else {
                        None
                    };
                    match why {
                        Some(why) => {
                            eprintln!("rdmabench: fleet: refused a join from {}: {why}", chan.peer());
                            let _ = chan.send(&Message::Refuse { code: 2, message: why });
                        }
                        None => chans[node as usize] = Some(chan),
                    }
                }
                Ok((mut chan, other)) => {
                    let _ = chan.send(&Message::Refuse {
                        code: 2,
                        message: format!("this is a fleet's barrier; a {} has no place here", other.kind()),
                    });
                }
                Err(e @ Error::Interrupted(_)) => {
                    eprintln!("rdmabench: fleet: {e}");
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// Waits for every live node's arrival at `step`, keeping the rows it brings.
    fn arrivals(&self, step: u32, chans: &mut [Option<Channel>], out: &mut Outcome) {
        let deadline = Instant::now() + self.step_timeout;
        let mut arrived = vec![false; chans.len()];
        loop {
            let mut waiting = false;
            for (i, slot) in chans.iter_mut().enumerate() {
                let Some(c) = slot else { continue };
                if arrived[i] {
                    continue;
                }
                match c.poll_peer("the fleet's next step") {
                    Ok(PeerPoll::Quiet) => waiting = true,
                    Ok(PeerPoll::Message(Message::Arrive { step: s, rows })) if s == step => {
                        match rows.iter().try_for_each(|r| own_row(r, i as u32, self.nodes)) {
                            Ok(()) => out.rows.extend(rows),
                            Err(why) => {
                                out.dead.insert(i as u32, format!("sent a bad row at step {step}: {why}"));
                                *slot = None;
                                continue;
                            }
                        }
                        arrived[i] = true;
                    }
                    Ok(PeerPoll::Message(m)) => {
                        out.dead
                            .insert(i as u32, format!("sent {} where its arrival at step {step} was due", m.kind()));
                        *slot = None;
                    }
                    Err(e) => {
                        out.dead.insert(i as u32, format!("left the fleet at step {step}: {e}"));
                        *slot = None;
                    }
                }
            }
            if !waiting {
                return;
            }
            if Instant::now() >= deadline {
                for (i, slot) in chans.iter_mut().enumerate() {
                    if slot.is_some() && !arrived[i] {
                        out.dead.insert(
                            i as u32,
                            format!("did not reach step {step} within {:.0} s", self.step_timeout.as_secs_f64()),
                        );
                        *slot = None;
                    }
                }
                return;
            }
            std::thread::sleep(SWEEP);
        }
    }
}

/// A row node `from` may send: one it measured itself, of this fleet.
fn own_row(r: &PairRow, from: u32, nodes: u32) -> std::result::Result<(), String> {
    r.check(nodes)?;
    if r.client != from {
        return Err(format!("a row of node {}'s measurement", r.client));
    }
    Ok(())
}

/// The pairs of `step` that no row reports: their client left the fleet before it could.
fn fill_missing(step: u32, round: u32, retest: bool, pairs: &[Pair], out: &mut Outcome) {
    for p in pairs {
        if out.rows.iter().any(|r| r.step == step && r.client == p.client && r.server == p.server) {
            continue;
        }
        let why = out
            .dead
            .get(&p.client)
            .map(|w| format!("node {} {w}", p.client))
            .unwrap_or_else(|| format!("node {} reported no result", p.client));
        out.rows.push(PairRow::failed(step, round, retest, p.client, p.server, why));
    }
}

/// The retests, in steps where no node is in two pairs: each suspect node against the
/// best node that is not suspect, each suspect link again. A node bad only for its
/// failures (it left the fleet, or failed against half its partners) is not retested.
fn retest_steps(nodes: u32, out: &Outcome, t: &Thresholds) -> Vec<Vec<Pair>> {
    let planned: Vec<Observation> = out.rows.iter().filter(|r| !r.retest).map(observation).collect();
    let a = attribution::attribute(nodes, &planned, t);
    let alive = |x: u32| !out.dead.contains_key(&x);
    let good: Vec<u32> = {
        let mut g: Vec<&attribution::NodeVerdict> =
            a.nodes.iter().filter(|n| !n.bad && n.ratio.is_some() && alive(n.node)).collect();
        g.sort_by(|x, y| y.ratio.partial_cmp(&x.ratio).unwrap_or(std::cmp::Ordering::Equal));
        g.iter().map(|n| n.node).collect()
    };
    let mut pairs = Vec::new();
    let slow = |n: &&attribution::NodeVerdict| n.reasons.iter().any(|r| !r.starts_with("failed against"));
    for n in a.nodes.iter().filter(|n| n.bad && alive(n.node)).filter(slow) {
        if let Some(&g) = good.first() {
            pairs.push(Pair { client: n.node, server: g });
        }
    }
    for l in a.links.iter().filter(|l| l.bad && l.ratio.is_some() && alive(l.a) && alive(l.b)) {
        pairs.push(Pair { client: l.a, server: l.b });
    }
    let mut steps: Vec<Vec<Pair>> = Vec::new();
    for p in pairs {
        let free = steps
            .iter_mut()
            .find(|s| s.iter().all(|q| ![q.client, q.server].iter().any(|x| *x == p.client || *x == p.server)));
        match free {
            Some(s) => s.push(p),
            None => steps.push(vec![p]),
        }
    }
    steps
}

/// A row as the verdict's arithmetic sees it.
pub fn observation(r: &PairRow) -> Observation {
    Observation {
        client: r.client,
        server: r.server,
        gbps: r.gbps,
        p50_us: r.p50_us,
        error: if r.ok() { None } else { Some(r.error.clone().unwrap_or_else(|| r.status.clone())) },
        retest: r.retest,
    }
}
