//! The fleet's barrier as a state machine, without sockets: the one authority for what
//! each node does next. It owns the step list (the planned steps, then the retests it
//! appends once they end), takes what the nodes do (join, arrive with their rows, leave)
//! and the time, and answers with what to send (each node's task, a dismissal, the end).
//! `coordinator` runs it over the control channel; the tests run it with simulated time.
//!
//! A step begins when every live node has arrived: each node is told its task (measure
//! against a server, serve a client, rest, or the end). A node that leaves (its
//! connection ends, it does not arrive within the step's deadline, it sends a row that is
//! not its own or a message out of turn) is out for good: the pairs it can no longer run
//! or report get a failed row written here, so every pair has exactly one row, by the
//! node that measured it or by the coordinator.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::time::Duration;

use super::attribution::{self, NodeReason, Observation, Thresholds};
use super::rows::{self, Expected, Figures};
use super::schedule::{Pair, Step};
use crate::report::pairs::{FailureKind, PairError, PairRow, Phase, Retest, RowSource, ServedRow};
use crate::session::proto::{Task, Work};

/// Why a node is no longer in the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    NeverJoined { within: Duration },
    Late { step: u32, within: Duration },
    Lost { step: u32, why: String },
    BadRow { step: u32, why: String },
    OutOfTurn { step: u32, sent: &'static str },
}

impl fmt::Display for Departure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Departure::NeverJoined { within } => write!(f, "never joined within {:.0} s", within.as_secs_f64()),
            Departure::Late { step, within } => {
                write!(f, "did not reach step {step} within {:.0} s", within.as_secs_f64())
            }
            Departure::Lost { step, why } => write!(f, "left the fleet at step {step}: {why}"),
            Departure::BadRow { step, why } => write!(f, "sent a bad row at step {step}: {why}"),
            Departure::OutOfTurn { step, sent } => write!(f, "sent {sent} where its arrival at step {step} was due"),
        }
    }
}

/// What the socket layer does for the barrier.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this task to the node.
    Send { node: u32, task: Task },
    /// The node is out (it learns why); close its connection.
    Dismiss { node: u32, why: String },
    /// The fleet is over; every live node has its `Done`.
    Done,
}

#[derive(Debug, Clone, PartialEq)]
enum Member {
    Absent,
    /// Joined; `arrived`: at the step awaited now.
    In {
        arrived: bool,
    },
    Left(Departure),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Joining {
        until: Duration,
    },
    /// Step `step`'s tasks are out; each node's arrival at `step + 1` is awaited.
    Running {
        step: u32,
        until: Duration,
    },
    Done,
}

/// One step of the list: its pairs, what each measures, and whether their rows are due
/// at the next arrival (the pairs' last phase).
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    pub phases: Vec<Phase>,
    /// Shared by the steps of one set's phases (a thousand nodes' plan holds half a
    /// million pairs once, not once a phase).
    pub pairs: std::sync::Arc<[Expected]>,
    pub reports: bool,
}

/// A pair to measure: its round of the schedule, and what it retests.
type Planned = (Pair, u32, Option<Retest>);

/// The steps of one set of pairs that measure at the same time, `first` the first's
/// index: a step per group of `phases`, with a barrier between them (every pair's
/// bandwidth at once, then every pair's latency, so no latency is measured beside another
/// pair's stream); the last reports the rows, which carry its index.
fn phased(pairs: &[Planned], phases: &[Vec<Phase>], first: u32) -> Vec<StepPlan> {
    let last = first + phases.len() as u32 - 1;
    let expected: std::sync::Arc<[Expected]> =
        pairs.iter().map(|&(pair, round, retest)| Expected { step: last, round, retest, pair }).collect();
    phases
        .iter()
        .enumerate()
        .map(|(k, group)| StepPlan { phases: group.clone(), pairs: expected.clone(), reports: k + 1 == phases.len() })
        .collect()
}

/// What the barrier saw: every pair's row (the nodes' and its own; a healthy planned
/// pair's as its figures alone) and who left, and why.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every row but those kept as `figures`: failed pairs, retests, the coordinator's.
    pub rows: Vec<PairRow>,
    /// The healthy planned pairs, each as the figures the verdict weighs ([`Figures`]).
    pub figures: Vec<Figures>,
    /// Each node's name, from the first row that gave it.
    pub names: Vec<Option<String>>,
    /// What the server saw of each pair that node 0 shows from both ends (a failed pair,
    /// or one whose server had an error); `rows::join_served` joins them.
    pub served: Vec<ServedRow>,
    /// How many servers' records came (every pair's server sends one).
    pub records: usize,
    pub dead: BTreeMap<u32, Departure>,
}

#[cfg(test)]
impl Outcome {
    /// Every row, the healthy ones rebuilt from their figures: what the tests look at.
    pub fn all_rows(&self) -> Vec<PairRow> {
        let mut all = self.rows.clone();
        all.extend(self.figures.iter().map(|f| {
            let mut r = PairRow::blank(f.step, 0, None, f.client, f.server);
            (r.gbps, r.p50_us, r.p99_us) = (f.gbps, f.p50_us, f.p99_us);
            r
        }));
        all
    }
}

impl Outcome {
    /// The rows only the coordinator has (their measuring node could not report them):
    /// node 0 prints these, so every pair's row is printed once.
    pub fn coordinator_rows(&self) -> impl Iterator<Item = &PairRow> {
        self.rows.iter().filter(|r| r.source == RowSource::Coordinator)
    }

    /// How many rows the pairs have: whole rows and figures.
    pub fn row_count(&self) -> usize {
        self.rows.len() + self.figures.len()
    }

    /// Every row as the verdict's arithmetic sees it.
    pub fn observations(&self) -> Vec<Observation> {
        self.rows.iter().map(rows::observation).chain(self.figures.iter().map(Figures::observation)).collect()
    }
}

pub struct Barrier {
    nodes: u32,
    fingerprint: String,
    steps: Vec<StepPlan>,
    planned: usize,
    phases: Vec<Vec<Phase>>,
    /// The most pairs any planned step runs at once (`--max-pairs-per-round`, or a whole
    /// round): retests never run more, so a fleet that judges latency one pair at a time
    /// retests one pair at a time too.
    pairs_at_once: usize,
    thresholds: Thresholds,
    join_timeout: Duration,
    step_timeout: Duration,
    members: Vec<Member>,
    /// The pair each node measures in the running step, if it measures.
    assigned: Vec<Option<Expected>>,
    stage: Stage,
    rows: Vec<PairRow>,
    figures: Vec<Figures>,
    names: Vec<Option<String>>,
    /// Where the rows and figures of the running step begin.
    step_rows: usize,
    step_figures: usize,
    /// The rows kept whole, by (step, client, server): their servers' records are kept.
    whole: HashSet<(u32, u32, u32)>,
    records: usize,
    retests_added: bool,
    /// The servers' records not yet received, by (step, client, server): a node may send
    /// only these.
    owed: HashSet<(u32, u32, u32)>,
    served: Vec<ServedRow>,
    /// Whether the last step, where every node rests so that the last servers can send
    /// their records, is in the list.
    flushed: bool,
}

impl Barrier {
    /// A barrier for `nodes` nodes with `fingerprint` (the plan every node must share)
    /// over the schedule's `steps`, each run as a step per group of `phases` (retests
    /// too); `now` is the time the nodes begin to join.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        nodes: u32,
        fingerprint: String,
        steps: &[Step],
        phases: &[Vec<Phase>],
        thresholds: Thresholds,
        join_timeout: Duration,
        step_timeout: Duration,
        now: Duration,
    ) -> Barrier {
        let mut list = Vec::new();
        for s in steps {
            let pairs: Vec<_> = s.pairs.iter().map(|&p| (p, s.round, None)).collect();
            list.extend(phased(&pairs, phases, list.len() as u32));
        }
        // Every planned pair's figures, reserved at once: half a million at a thousand
        // nodes, which a doubling vector would copy (and hold twice) as they come.
        let pairs: usize = steps.iter().map(|s| s.pairs.len()).sum();
        Barrier {
            nodes,
            fingerprint,
            planned: list.len(),
            steps: list,
            phases: phases.to_vec(),
            pairs_at_once: steps.iter().map(|s| s.pairs.len()).max().unwrap_or(1).max(1),
            thresholds,
            join_timeout,
            step_timeout,
            members: vec![Member::Absent; nodes as usize],
            assigned: vec![None; nodes as usize],
            stage: Stage::Joining { until: now + join_timeout },
            rows: Vec::new(),
            figures: Vec::with_capacity(pairs),
            names: vec![None; nodes as usize],
            step_rows: 0,
            step_figures: 0,
            whole: HashSet::new(),
            records: 0,
            retests_added: false,
            owed: HashSet::new(),
            served: Vec::new(),
            flushed: false,
        }
    }

    /// The step whose arrival is awaited (0 while joining).
    fn awaited(&self) -> u32 {
        match self.stage {
            Stage::Joining { .. } => 0,
            Stage::Running { step, .. } => step + 1,
            Stage::Done => self.steps.len() as u32,
        }
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    pub fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    /// When `tick` has something to do, if ever.
    pub fn next_deadline(&self) -> Option<Duration> {
        match self.stage {
            Stage::Joining { until } | Stage::Running { until, .. } => Some(until),
            Stage::Done => None,
        }
    }

    /// The steps so far: the planned ones, then the retests once they are known.
    pub fn steps(&self) -> &[StepPlan] {
        &self.steps
    }

    /// Whether node `node` may join with this plan; Err says why not (the node is told).
    pub fn join(&mut self, node: u32, nodes: u32, plan: &str) -> Result<(), String> {
        if nodes != self.nodes || plan != self.fingerprint {
            return Err(format!(
                "its plan ({nodes} nodes, {plan}) is not this fleet's ({}, {})",
                self.nodes, self.fingerprint
            ));
        }
        match self.members.get(node as usize) {
            None => Err(format!("node {node} is no node of a fleet of {}", self.nodes)),
            Some(Member::In { .. }) => Err(format!("node {node} has joined already")),
            Some(Member::Left(why)) => Err(format!("node {node} {why}; the fleet went on without it")),
            Some(Member::Absent) => {
                self.members[node as usize] = Member::In { arrived: false };
                Ok(())
            }
        }
    }

    /// Node `node` arrives at `step` with the rows of the step before and its records of
    /// the pair it served before that.
    pub fn arrive(
        &mut self,
        node: u32,
        step: u32,
        rows: Vec<PairRow>,
        served: Vec<ServedRow>,
        now: Duration,
    ) -> Vec<Action> {
        if self.is_done() {
            return Vec::new();
        }
        let awaited = self.awaited();
        match self.members.get(node as usize) {
            Some(Member::In { arrived: false }) if step == awaited => {}
            Some(Member::In { .. }) => {
                let why = Departure::OutOfTurn {
                    step: awaited,
                    sent: if step == awaited { "a second arrival" } else { "an arrival for another step" },
                };
                return self.depart(node, why, now);
            }
            _ => return Vec::new(),
        }
        if let Err(why) = self.check_rows(node, &rows).and_then(|()| self.check_served(node, &served)) {
            return self.depart(node, Departure::BadRow { step: awaited, why }, now);
        }
        for r in rows {
            self.keep(r);
        }
        for s in served {
            let key = (s.step, s.client, s.server);
            self.owed.remove(&key);
            self.records += 1;
            // A healthy pair is shown from its client's side alone.
            if s.error.is_some() || self.whole.contains(&key) {
                self.served.push(s);
            }
        }
        self.members[node as usize] = Member::In { arrived: true };
        self.advance(now)
    }

    /// Keeps a row: its figures when they are all node 0 needs, else the row (slimmed),
    /// and the names of its nodes.
    fn keep(&mut self, mut r: PairRow) {
        super::output::note_names(&mut self.names, &r);
        match Figures::of(&r) {
            Some(f) => self.figures.push(f),
            None => {
                r.slim();
                self.whole.insert((r.step, r.client, r.server));
                self.rows.push(r);
            }
        }
    }

    /// Node `node` sent `kind` where only its arrival may come.
    pub fn out_of_turn(&mut self, node: u32, kind: &'static str, now: Duration) -> Vec<Action> {
        if self.is_done() || !self.live(node) {
            return Vec::new();
        }
        let step = self.awaited();
        self.depart(node, Departure::OutOfTurn { step, sent: kind }, now)
    }

    /// Node `node`'s connection ended (`why`).
    /// After the end, a node's leaving is just its exit.
    pub fn lost(&mut self, node: u32, why: String, now: Duration) -> Vec<Action> {
        if self.is_done() {
            return Vec::new();
        }
        let step = self.awaited();
        match (self.members.get(node as usize), self.stage) {
            // Before the start a node whose connection broke may join again (a join cut
            // under a storm of joins is retried), until the join timeout.
            (Some(Member::In { .. }), Stage::Joining { .. }) => {
                self.members[node as usize] = Member::Absent;
                Vec::new()
            }
            (Some(Member::In { .. }), _) => {
                self.members[node as usize] = Member::Left(Departure::Lost { step, why });
                self.advance(now)
            }
            _ => Vec::new(),
        }
    }

    /// The time is `now`: nodes past a deadline leave, and the fleet goes on without them.
    pub fn tick(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        match self.stage {
            Stage::Joining { until } if now >= until => {
                for (i, m) in self.members.iter_mut().enumerate() {
                    let why = match m {
                        Member::Absent => Departure::NeverJoined { within: self.join_timeout },
                        Member::In { arrived: false } => Departure::Late { step: 0, within: self.join_timeout },
                        _ => continue,
                    };
                    if matches!(m, Member::In { .. }) {
                        out.push(Action::Dismiss { node: i as u32, why: why.to_string() });
                    }
                    *m = Member::Left(why);
                }
            }
            Stage::Running { step, until } if now >= until => {
                for (i, m) in self.members.iter_mut().enumerate() {
                    if *m == (Member::In { arrived: false }) {
                        let why = Departure::Late { step: step + 1, within: self.step_timeout };
                        out.push(Action::Dismiss { node: i as u32, why: why.to_string() });
                        *m = Member::Left(why);
                    }
                }
            }
            _ => return out,
        }
        out.extend(self.advance(now));
        out
    }

    /// What the barrier saw.
    pub fn into_outcome(self) -> Outcome {
        let dead = self
            .members
            .into_iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Member::Left(why) => Some((i as u32, why)),
                _ => None,
            })
            .collect();
        Outcome {
            rows: self.rows,
            figures: self.figures,
            names: self.names,
            served: self.served,
            records: self.records,
            dead,
        }
    }

    fn depart(&mut self, node: u32, why: Departure, now: Duration) -> Vec<Action> {
        let mut out = vec![Action::Dismiss { node, why: why.to_string() }];
        self.members[node as usize] = Member::Left(why);
        out.extend(self.advance(now));
        out
    }

    /// A node brings the row of the pair it was given in the step that ended, and nothing
    /// else.
    fn check_rows(&self, node: u32, rows: &[PairRow]) -> Result<(), String> {
        let due = match self.stage {
            Stage::Running { step, .. } => self.steps[step as usize].reports,
            _ => false,
        };
        let given = self.assigned[node as usize].as_ref().filter(|_| due);
        for r in rows {
            r.check(self.nodes)?;
        }
        match (given, rows) {
            (None, []) => Ok(()),
            (Some(e), [r]) => {
                if (r.step, r.client, r.server) != (e.step, e.pair.client, e.pair.server) {
                    Err(format!(
                        "pair {} -> {} at step {} is not its task ({} -> {})",
                        r.client, r.server, r.step, e.pair.client, e.pair.server
                    ))
                } else if r.retest != e.retest || r.source != RowSource::Client {
                    Err(format!("pair {} -> {} is not the measurement it was given", r.client, r.server))
                } else {
                    Ok(())
                }
            }
            (Some(e), _) => Err(format!("{} rows for its one pair {} -> {}", rows.len(), e.pair.client, e.pair.server)),
            (None, [r, ..]) => {
                Err(format!("pair {} -> {} at step {} was no task of node {node}", r.client, r.server, r.step))
            }
        }
    }

    /// A node brings its records of the pairs it served, each once.
    fn check_served(&self, node: u32, served: &[ServedRow]) -> Result<(), String> {
        let mut here = HashSet::new();
        for s in served {
            s.check(self.nodes)?;
            let key = (s.step, s.client, s.server);
            // Owed and not already in this arrival: `owed` loses the key only once the
            // arrival is taken.
            if s.server != node || !self.owed.contains(&key) || !here.insert(key) {
                return Err(format!(
                    "a record of pair {} -> {} at step {} that node {node} did not serve, or sent before",
                    s.client, s.server, s.step
                ));
            }
        }
        Ok(())
    }

    fn live(&self, node: u32) -> bool {
        matches!(self.members[node as usize], Member::In { .. })
    }

    /// Begins the next step once every live node has arrived (again and again while
    /// nobody is left to wait for), and the end after the last.
    fn advance(&mut self, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        while self.stage != Stage::Done && !self.members.contains(&Member::In { arrived: false }) {
            if matches!(self.stage, Stage::Joining { .. }) && self.members.contains(&Member::Absent) {
                break;
            }
            self.close_step();
            let next = self.awaited();
            if next as usize == self.planned && !self.retests_added {
                self.retests_added = true;
                let retests = retest_steps(self, next);
                self.steps.extend(retests);
            }
            (self.step_rows, self.step_figures) = (self.rows.len(), self.figures.len());
            if next as usize == self.steps.len() && !self.flushed && !self.owed.is_empty() {
                // A server learns that its pair is over from its next task, and sends its
                // record with the arrival after: one more step, where everyone rests.
                self.flushed = true;
                self.steps.push(StepPlan { phases: Vec::new(), pairs: Vec::new().into(), reports: false });
            }
            if next as usize >= self.steps.len() {
                self.stage = Stage::Done;
                for i in 0..self.nodes {
                    if self.live(i) {
                        out.push(Action::Send { node: i, task: Task { step: next, work: Work::Done } });
                    }
                }
                out.push(Action::Done);
                break;
            }
            self.stage = Stage::Running { step: next, until: now + self.step_timeout };
            out.extend(self.hand_out(next));
        }
        out
    }

    /// The rows of the step that ended which no node reported: their client left.
    fn close_step(&mut self) {
        let Stage::Running { step, .. } = self.stage else { return };
        if !self.steps[step as usize].reports {
            return;
        }
        let members = &self.members;
        let present = self.rows[self.step_rows..]
            .iter()
            .map(rows::key)
            .chain(self.figures[self.step_figures..].iter().map(|f| (f.client, f.server, false)));
        let filled = rows::missing(present, &self.steps[step as usize].pairs, |e| {
            let x = e.pair.client;
            PairError::node_left(x, format!("node {x} {}", departure_of(members, x)))
        });
        for r in filled {
            self.keep(r);
        }
    }

    /// Each live node's task in step `step`; a pair with a node that left gets its row here.
    fn hand_out(&mut self, step: u32) -> Vec<Action> {
        let plan = self.steps[step as usize].clone();
        self.assigned.iter_mut().for_each(|a| *a = None);
        let mut tasks: Vec<Option<Work>> = (0..self.nodes).map(|i| self.live(i).then_some(Work::Rest)).collect();
        for e in plan.pairs.iter() {
            let Pair { client, server } = e.pair;
            let gone = [client, server].into_iter().find(|&x| !self.live(x));
            if let Some(x) = gone {
                // The step that reports the pair writes its row.
                if !plan.reports {
                    continue;
                }
                let why = format!("node {x} {}", departure_of(&self.members, x));
                let error = PairError::node_left(x, why);
                let mut r = PairRow::failed(e.step, e.round, e.retest, client, server, error);
                r.source = RowSource::Coordinator;
                self.keep(r);
                continue;
            }
            tasks[client as usize] = Some(Work::Measure {
                server,
                round: e.round,
                phases: plan.phases.clone(),
                retest: e.retest,
                report: plan.reports,
            });
            self.assigned[client as usize] = Some(*e);
            if plan.reports {
                self.owed.insert((e.step, client, server));
            }
            tasks[server as usize] = Some(Work::Serve { client, report: plan.reports });
        }
        for m in self.members.iter_mut() {
            if let Member::In { arrived } = m {
                *arrived = false;
            }
        }
        tasks
            .into_iter()
            .enumerate()
            .filter_map(|(i, w)| w.map(|work| Action::Send { node: i as u32, task: Task { step, work } }))
            .collect()
    }
}

fn departure_of(members: &[Member], node: u32) -> String {
    match &members[node as usize] {
        Member::Left(why) => why.to_string(),
        _ => "reported no result".into(),
    }
}

/// The retests, in steps where no node is in two pairs and no more pairs run than in a
/// planned step (two ping-pongs at once measure the scheduler), numbered from `first`: each
/// suspect node that is still in the fleet (slow, or failing against many partners)
/// against the best node that is not suspect, each suspect link again, each failed pair
/// again. A node that left the fleet is bad for leaving and is not retested.
fn retest_steps(b: &Barrier, first: u32) -> Vec<StepPlan> {
    let observations: Vec<Observation> = b
        .rows
        .iter()
        .filter(|r| !r.is_retest())
        .map(rows::observation)
        .chain(b.figures.iter().map(Figures::observation))
        .collect();
    let a = attribution::attribute(b.nodes, &observations, &b.thresholds);
    let alive = |x: u32| b.live(x);
    let mut good: Vec<&attribution::NodeVerdict> =
        a.nodes.iter().filter(|n| !n.bad && n.ratio.is_some() && alive(n.node)).collect();
    good.sort_by(|x, y| y.ratio.partial_cmp(&x.ratio).unwrap_or(std::cmp::Ordering::Equal));
    let mut pairs = Vec::new();
    for n in a.nodes.iter().filter(|n| n.bad && alive(n.node) && n.reasons.iter().any(|r| r.is_retestable())) {
        let Some(g) = good.first() else { continue };
        // In the role it failed in: a node that failed only while serving (its serving
        // thread stuck, its port refusing connections) is retested as the server.
        let failed_as = |client: bool| {
            b.rows.iter().filter(|r| !r.is_retest() && r.error.is_some() && (r.client == n.node) == client).count()
        };
        let serves = failed_as(false) > 0 && failed_as(true) == 0;
        let pair =
            if serves { Pair { client: g.node, server: n.node } } else { Pair { client: n.node, server: g.node } };
        pairs.push((pair, Retest::Node { node: n.node }));
    }
    for l in a.links.iter().filter(|l| l.bad && l.ratio.is_some() && alive(l.a) && alive(l.b)) {
        pairs.push((Pair { client: l.a, server: l.b }, Retest::Link { a: l.a, b: l.b }));
    }
    // A failed pair again, against the same peer: a one-off passes (flaky), a fault fails
    // again. Not where a node left, nor of a node that fails against many of its partners
    // (the node's own retest judges those, and theirs would take a step each).
    let failing = |x: u32| a.nodes[x as usize].reasons.iter().any(NodeReason::is_failures);
    for r in b.rows.iter().filter(|r| !r.is_retest()) {
        let Some(e) = &r.error else { continue };
        if e.kind != FailureKind::NodeLeft
            && alive(r.client)
            && alive(r.server)
            && !failing(r.client)
            && !failing(r.server)
        {
            pairs.push((Pair { client: r.client, server: r.server }, Retest::Failed));
        }
    }
    let mut sets: Vec<(Vec<Planned>, HashSet<u32>)> = Vec::new();
    for (pair, retest) in pairs {
        let fits = |(set, busy): &(Vec<Planned>, HashSet<u32>)| {
            set.len() < b.pairs_at_once && !busy.contains(&pair.client) && !busy.contains(&pair.server)
        };
        let at = match sets.iter().position(fits) {
            Some(at) => at,
            None => {
                sets.push((Vec::new(), HashSet::new()));
                sets.len() - 1
            }
        };
        let (set, busy) = &mut sets[at];
        set.push((pair, 0, Some(retest)));
        busy.extend([pair.client, pair.server]);
    }
    let mut steps = Vec::new();
    for (set, _) in sets {
        steps.extend(phased(&set, &b.phases, first + steps.len() as u32));
    }
    steps
}

#[cfg(test)]
mod tests;
