//! The barrier driven by simulated nodes and simulated time: no sockets, no clock.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::fleet::schedule::{Directions, Plan};

const JOIN: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_secs(100);
/// Both measurements of a pair in one step.
fn together() -> Vec<Vec<Phase>> {
    vec![vec![Phase::Bandwidth, Phase::Latency]]
}

/// Every pair's bandwidth in one step, then every pair's latency in the next.
fn apart() -> Vec<Vec<Phase>> {
    vec![vec![Phase::Bandwidth], vec![Phase::Latency]]
}

/// A fleet of simulated nodes around one barrier.
struct Sim {
    b: Barrier,
    now: Duration,
    /// Each node's task for the step it is in (None: it has none, or is out).
    tasks: Vec<Option<Task>>,
    dismissed: BTreeMap<u32, String>,
    done: bool,
    /// The rows the nodes printed (the coordinator's are in the outcome).
    printed: Vec<PairRow>,
    /// Bandwidth of client -> server.
    gbps: fn(u32, u32) -> f64,
    /// Every step's (client, server) pairs as handed out.
    handed: BTreeMap<u32, Vec<(u32, u32)>>,
    /// The pair each node served in its last step, reporting (step, client): its record
    /// rides on the arrival after the next, as a real node's does.
    serving: Vec<Option<(u32, u32)>>,
    rng: u64,
}

fn plan(nodes: u32, directions: Directions, cap: Option<u32>) -> Plan {
    Plan { nodes, directions, max_pairs_per_round: cap }
}

impl Sim {
    fn new(p: Plan) -> Sim {
        Sim::phased(p, &together())
    }

    fn phased(p: Plan, phases: &[Vec<Phase>]) -> Sim {
        let steps = p.steps();
        let b = Barrier::new(p.nodes, "plan".into(), &steps, phases, Thresholds::default(), JOIN, STEP, Duration::ZERO);
        Sim {
            b,
            now: Duration::ZERO,
            tasks: vec![None; p.nodes as usize],
            dismissed: BTreeMap::new(),
            done: false,
            printed: Vec::new(),
            gbps: |_, _| 100.0,
            handed: BTreeMap::new(),
            serving: vec![None; p.nodes as usize],
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn random(&mut self, below: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % below.max(1) as u64) as usize
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send { node, task } => {
                    assert!(!self.dismissed.contains_key(&node), "a task for dismissed node {node}");
                    assert!(!self.done, "a task after the end");
                    if let Work::Measure { server, .. } = task.work {
                        let step = self.handed.entry(task.step).or_default();
                        step.push((node, server));
                    }
                    let slot = &mut self.tasks[node as usize];
                    assert!(
                        slot.as_ref().is_none_or(|t| t.step < task.step),
                        "node {node} given {task:?} over {slot:?}"
                    );
                    *slot = Some(task);
                }
                Action::Dismiss { node, why } => {
                    self.dismissed.insert(node, why);
                    self.tasks[node as usize] = None;
                }
                Action::Done => self.done = true,
            }
        }
    }

    fn join(&mut self, node: u32) {
        self.b.join(node, self.b.nodes, "plan").unwrap();
    }

    fn arrive(&mut self, node: u32, step: u32, rows: Vec<PairRow>) {
        self.arrive_with(node, step, rows, Vec::new());
    }

    fn arrive_with(&mut self, node: u32, step: u32, rows: Vec<PairRow>, served: Vec<ServedRow>) {
        self.now += Duration::from_millis(7);
        let a = self.b.arrive(node, step, rows, served, self.now);
        self.apply(a);
    }

    /// The row node `node` reports for its task (`None`: it had no measurement).
    fn row_of(&self, node: u32, task: &Task) -> Option<PairRow> {
        let Work::Measure { server, round, retest, report: true, .. } = task.work else { return None };
        let mut r = PairRow::blank(task.step, round, retest, node, server);
        let gbps = (self.gbps)(node, server);
        // NaN: the pair failed.
        if gbps.is_nan() {
            r.error = Some(PairError::of(&crate::error::Error::Peer("remote invalid request".into()), None));
        } else {
            (r.gbps, r.p50_us) = (Some(gbps), Some(5.0));
        }
        Some(r)
    }

    /// Every live node that has a task does it and arrives at the next step, in a random
    /// order; false when nobody had one.
    fn step_all(&mut self) -> bool {
        let mut ready: Vec<u32> = (0..self.tasks.len() as u32)
            .filter(|&i| self.tasks[i as usize].as_ref().is_some_and(|t| t.work != Work::Done))
            .collect();
        if ready.is_empty() {
            return false;
        }
        while !ready.is_empty() {
            let k = self.random(ready.len());
            let node = ready.swap_remove(k);
            self.step_one(node);
        }
        true
    }

    fn step_one(&mut self, node: u32) {
        let task = self.tasks[node as usize].take().unwrap();
        let rows: Vec<PairRow> = self.row_of(node, &task).into_iter().collect();
        self.printed.extend(rows.iter().cloned());
        let served = self.served_before(node, &task);
        self.arrive_with(node, task.step + 1, rows, served);
    }

    /// Node `node`, given `task`, knows the pair it served in the step before is over.
    fn served_before(&mut self, node: u32, task: &Task) -> Vec<ServedRow> {
        let done = self.serving[node as usize].take();
        if let Work::Serve { client, report: true } = task.work {
            self.serving[node as usize] = Some((task.step, client));
        }
        done.map(|(step, client)| ServedRow { step, client, server: node, counters: Default::default(), error: None })
            .into_iter()
            .collect()
    }

    /// Everyone joins and arrives at step 0, in a random order.
    fn start(&mut self) {
        let mut order: Vec<u32> = (0..self.b.nodes).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, self.random(i + 1));
        }
        for &i in &order {
            self.join(i);
        }
        for &i in &order {
            self.arrive(i, 0, Vec::new());
        }
    }

    fn run_out(&mut self) {
        for _ in 0..100_000 {
            if !self.step_all() {
                break;
            }
        }
    }

    fn outcome(self) -> (Outcome, Vec<PairRow>) {
        (self.b.into_outcome(), self.printed)
    }
}

/// Every pair's rows across the nodes' logs and the coordinator's: (step, client, server)
/// -> how many.
fn printed_once(o: &Outcome, printed: &[PairRow]) -> BTreeMap<(u32, u32, u32), usize> {
    let mut count = BTreeMap::new();
    for r in printed.iter().chain(o.coordinator_rows()) {
        *count.entry((r.step, r.client, r.server)).or_insert(0) += 1;
    }
    assert!(count.values().all(|&c| c == 1), "a row printed twice: {count:?}");
    count
}

#[test]
fn the_whole_plan_walks_for_2_to_64_nodes_in_any_order() {
    for n in 2..=64 {
        for (dirs, cap, phases) in [
            (Directions::One, None, together()),
            (Directions::Both, None, together()),
            (Directions::Both, Some(2), together()),
            (Directions::Both, None, apart()),
        ] {
            if n > 24 && (cap.is_some() || phases.len() > 1) {
                continue;
            }
            let p = plan(n, dirs, cap);
            let mut sim = Sim::phased(p, &phases);
            sim.rng ^= n as u64 * 7919;
            sim.start();
            sim.run_out();
            assert!(sim.done && sim.b.is_done(), "{n} nodes: never ended");
            for (step, pairs) in &sim.handed {
                let mut busy = BTreeSet::new();
                for &(c, s) in pairs {
                    assert!(busy.insert(c) && busy.insert(s), "{n}: a node twice in step {step}: {pairs:?}");
                }
            }
            let steps = p.steps();
            assert_eq!(
                sim.b.steps().len(),
                steps.len() * phases.len() + 1,
                "a step per phase group, and one where the last servers send their records"
            );
            let planned: BTreeSet<(u32, u32)> =
                steps.iter().flat_map(|s| s.pairs.iter().map(|q| (q.client, q.server))).collect();
            let (o, printed) = sim.outcome();
            let rows = printed_once(&o, &printed);
            let measured: BTreeSet<(u32, u32)> = rows.keys().map(|&(_, c, s)| (c, s)).collect();
            assert_eq!(measured, planned, "{n} nodes {dirs:?} {cap:?} {phases:?}");
            assert_eq!(rows.len(), planned.len(), "one row a pair");
            assert!(o.dead.is_empty() && o.all_rows().iter().all(PairRow::ok), "{n}: {:?}", o.dead);
            assert_eq!(o.row_count(), planned.len(), "no retest in a healthy fleet");
            assert_eq!(o.records, planned.len(), "{n}: every pair's server sent its record, once");
            assert!(o.rows.is_empty() && o.served.is_empty(), "a healthy pair is kept as its figures alone");
        }
    }
}

#[test]
fn apart_every_pair_streams_in_one_step_and_pings_in_the_next() {
    let p = plan(6, Directions::One, None);
    let mut sim = Sim::phased(p, &apart());
    sim.start();
    let works: Vec<Work> = sim.tasks.iter().flatten().map(|t| t.work.clone()).collect();
    let measuring: Vec<&Work> = works.iter().filter(|w| matches!(w, Work::Measure { .. })).collect();
    assert_eq!(measuring.len(), 3, "every pair of the round at once");
    assert!(
        measuring
            .iter()
            .all(|w| matches!(w, Work::Measure { phases, report: false, .. } if phases == &[Phase::Bandwidth]))
    );
    // No row is due after the bandwidth step; one arriving with a row is dismissed.
    let t = sim.tasks.iter().flatten().find(|t| matches!(t.work, Work::Measure { .. })).unwrap().clone();
    let Work::Measure { server, .. } = t.work else { unreachable!() };
    let node = (0..6).find(|&i| sim.tasks[i as usize].as_ref() == Some(&t)).unwrap();
    let early = PairRow::blank(t.step, 0, None, node, server);
    let a = sim.b.arrive(node, t.step + 1, vec![early], Vec::new(), sim.now);
    assert!(
        matches!(&a[0], Action::Dismiss { why, .. } if why.contains("rows for its one pair") || why.contains("was no task")),
        "{a:?}"
    );
}

#[test]
fn a_server_hears_who_measures_against_it_and_the_rest_rest() {
    let mut sim = Sim::new(plan(5, Directions::One, None));
    sim.start();
    let step0 = &plan(5, Directions::One, None).steps()[0];
    for i in 0..5 {
        let work = &sim.tasks[i as usize].as_ref().unwrap().work;
        match step0.role_of(i) {
            Some((p, true)) => assert!(
                matches!(work, Work::Measure { server, phases, retest: None, report: true, .. } if *server == p.server && phases == &together()[0])
            ),
            Some((p, false)) => assert_eq!(work, &Work::Serve { client: p.client, report: true }),
            None => assert_eq!(work, &Work::Rest),
        }
    }
}

/// Where node 3 of 6 leaves, by the step it is in.
#[derive(Debug, Clone, Copy)]
enum Death {
    NeverJoins,
    JoinsButNeverArrives,
    LostMidStep(u32),
    LostAfterArriving(u32),
    LateAt(u32),
}

fn fleet_where_node_3(death: Death) -> (Outcome, Vec<PairRow>) {
    let p = plan(6, Directions::Both, None);
    let mut sim = Sim::new(p);
    let others: Vec<u32> = (0..6).filter(|&i| i != 3).collect();
    for &i in &others {
        sim.join(i);
    }
    match death {
        Death::NeverJoins => {}
        _ => sim.join(3),
    }
    for &i in &others {
        sim.arrive(i, 0, Vec::new());
    }
    match death {
        Death::NeverJoins | Death::JoinsButNeverArrives => {
            assert!(!sim.b.steps().is_empty() && sim.tasks[0].is_none(), "step 0 waits for node 3");
            sim.now = JOIN;
            let a = sim.b.tick(sim.now);
            sim.apply(a);
        }
        _ => sim.arrive(3, 0, Vec::new()),
    }
    while let Some(step) = sim.tasks.iter().flatten().map(|t| t.step).next() {
        if sim.done {
            break;
        }
        match death {
            Death::LostMidStep(k) if step == k => {
                sim.tasks[3] = None;
                let a = sim.b.lost(3, "closed the connection".into(), sim.now);
                sim.apply(a);
            }
            Death::LostAfterArriving(k) if step == k => {
                sim.step_one(3);
                let a = sim.b.lost(3, "closed the connection".into(), sim.now);
                sim.apply(a);
            }
            Death::LateAt(k) if step == k => {
                sim.tasks[3] = None;
                for &i in &others {
                    if sim.tasks[i as usize].is_some() {
                        sim.step_one(i);
                    }
                }
                assert!(!sim.done && sim.b.next_deadline() > Some(sim.now), "waits for node 3");
                let before = sim.b.tick(sim.now);
                assert!(before.is_empty(), "nothing before the deadline");
                sim.now = sim.b.next_deadline().unwrap();
                let a = sim.b.tick(sim.now);
                assert!(
                    a.contains(&Action::Dismiss { node: 3, why: format!("did not reach step {} within 100 s", k + 1) }),
                    "{a:?}"
                );
                sim.apply(a);
                continue;
            }
            _ => {}
        }
        sim.step_all();
    }
    assert!(sim.done, "{death:?}: never ended");
    sim.outcome()
}

#[test]
fn a_node_dying_in_each_phase_leaves_every_pair_one_row_and_the_others_measured() {
    let p = plan(6, Directions::Both, None);
    let planned: BTreeSet<(u32, u32, u32)> =
        p.steps().iter().flat_map(|s| s.pairs.iter().map(move |q| (s.index, q.client, q.server))).collect();
    for death in [
        Death::NeverJoins,
        Death::JoinsButNeverArrives,
        Death::LostMidStep(0),
        Death::LostMidStep(4),
        Death::LostAfterArriving(6),
        Death::LateAt(2),
        Death::LateAt(9),
    ] {
        let (o, printed) = fleet_where_node_3(death);
        let rows = printed_once(&o, &printed);
        assert_eq!(rows.keys().copied().collect::<BTreeSet<_>>(), planned, "{death:?}");
        assert_eq!(o.dead.keys().copied().collect::<Vec<_>>(), [3], "{death:?}: {:?}", o.dead);
        for r in &o.all_rows() {
            let with_3 = r.client == 3 || r.server == 3;
            assert!(r.ok() || with_3, "{death:?}: a pair without node 3 failed: {r:?}");
            if r.source == RowSource::Coordinator {
                let e = r.error.as_ref().unwrap();
                assert_eq!(e.kind, crate::report::pairs::FailureKind::NodeLeft, "{death:?}");
                assert!(e.message.starts_with("node 3 "), "{death:?}: {}", e.message);
            }
        }
        let why = o.dead[&3].to_string();
        let expected = match death {
            Death::NeverJoins => "never joined within 60 s".to_string(),
            Death::JoinsButNeverArrives => "did not reach step 0 within 60 s".to_string(),
            Death::LostMidStep(k) => format!("left the fleet at step {}: closed the connection", k + 1),
            // It arrived at step k + 1 and left while the others were still in step k.
            Death::LostAfterArriving(k) => format!("left the fleet at step {}: closed the connection", k + 1),
            Death::LateAt(k) => format!("did not reach step {} within 100 s", k + 1),
        };
        assert_eq!(why, expected, "{death:?}");
        // A node judged for leaving is not retested.
        assert!(o.all_rows().iter().all(|r| !r.is_retest()), "{death:?}");
    }
}

#[test]
fn a_late_node_is_dismissed_and_a_node_that_left_cannot_rejoin() {
    let mut sim = Sim::new(plan(3, Directions::One, None));
    sim.join(0);
    sim.join(1);
    sim.arrive(0, 0, Vec::new());
    sim.arrive(1, 0, Vec::new());
    assert_eq!(sim.b.next_deadline(), Some(JOIN));
    sim.now = JOIN;
    let a = sim.b.tick(sim.now);
    sim.apply(a);
    let e = sim.b.join(2, 3, "plan").unwrap_err();
    assert_eq!(e, "node 2 never joined within 60 s; the fleet went on without it");
    assert!(sim.tasks[0].is_some() && sim.tasks[1].is_some());
    // A node lost in step 0 cannot come back either.
    sim.tasks[1] = None;
    let a = sim.b.lost(1, "reset".into(), sim.now);
    sim.apply(a);
    assert!(sim.b.join(1, 3, "plan").unwrap_err().contains("left the fleet at step 1: reset"));
    assert!(sim.b.join(0, 3, "plan").unwrap_err().contains("joined already"));
}

#[test]
fn joins_with_another_plan_or_index_are_refused() {
    let mut sim = Sim::new(plan(4, Directions::One, None));
    assert!(sim.b.join(0, 4, "other").unwrap_err().contains("is not this fleet's"));
    assert!(sim.b.join(0, 5, "plan").unwrap_err().contains("is not this fleet's"));
    assert!(sim.b.join(4, 4, "plan").unwrap_err().contains("no node of a fleet of 4"));
    sim.b.join(1, 4, "plan").unwrap();
    assert!(sim.b.join(1, 4, "plan").unwrap_err().contains("has joined already"), "a second node 1");
}

#[test]
fn a_node_whose_connection_broke_before_the_start_joins_again() {
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.b.join(2, 4, "plan").unwrap();
    // Its join cut under a storm of joins: not gone from the fleet, absent again.
    assert!(sim.b.lost(2, "the connection closed".into(), sim.now).is_empty());
    // Every node joins (node 2 again) and the fleet runs whole.
    sim.start();
    sim.run_out();
    let (o, _) = sim.outcome();
    assert!(o.dead.is_empty(), "{:?}", o.dead);
    // Once the fleet has begun, a lost node has left for good.
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.start();
    let _ = sim.tasks[2].take();
    let a = sim.b.lost(2, "killed".into(), sim.now);
    sim.apply(a);
    assert!(sim.b.join(2, 4, "plan").unwrap_err().contains("the fleet went on without it"));
}

#[test]
fn forged_duplicate_missing_and_out_of_turn_rows_dismiss_their_sender() {
    type Forge = fn(&mut Vec<PairRow>, u32);
    let cases: [(&str, Forge); 5] = [
        ("another node's pair", |rows, _| rows[0].client = (rows[0].client + 1) % 4),
        ("twice", |rows, _| rows.push(rows[0].clone())),
        ("none", |rows, _| rows.clear()),
        ("a step that is not this one", |rows, _| rows[0].step += 1),
        ("a retest it was not given", |rows, n| rows[0].retest = Some(Retest::Node { node: n })),
    ];
    for (what, forge) in cases {
        let mut sim = Sim::new(plan(4, Directions::One, None));
        sim.start();
        let task = sim.tasks[0].take().unwrap();
        let mut rows: Vec<PairRow> = sim.row_of(0, &task).into_iter().collect();
        forge(&mut rows, 0);
        let a = sim.b.arrive(0, 1, rows, Vec::new(), sim.now);
        assert!(
            matches!(&a[0], Action::Dismiss { node: 0, why } if why.starts_with("sent a bad row at step 1")),
            "{what}: {a:?}"
        );
        sim.apply(a);
        sim.run_out();
        assert!(sim.done, "{what}");
        let (o, printed) = sim.outcome();
        printed_once(&o, &printed);
        assert!(o.dead.contains_key(&0), "{what}");
    }
    // A second arrival, or one for another step, is out of turn.
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.start();
    sim.step_one(1);
    let a = sim.b.arrive(1, 1, Vec::new(), Vec::new(), sim.now);
    assert!(
        matches!(&a[0], Action::Dismiss { node: 1, why } if why == "sent a second arrival where its arrival at step 1 was due"),
        "{a:?}"
    );
    let a = sim.b.arrive(2, 7, Vec::new(), Vec::new(), sim.now);
    assert!(matches!(&a[0], Action::Dismiss { node: 2, .. }), "{a:?}");
    let a = sim.b.out_of_turn(3, "hello", sim.now);
    assert!(
        matches!(&a[0], Action::Dismiss { node: 3, why } if why == "sent hello where its arrival at step 1 was due"),
        "{a:?}"
    );
}

/// Node 2 at half speed, link 1 - 4 at half speed, node 5 the best node by a little.
fn slow_node_2_and_link_1_4(c: u32, s: u32) -> f64 {
    let node = if c == 2 || s == 2 { 0.5 } else { 1.0 };
    let link = if (c.min(s), c.max(s)) == (1, 4) { 0.5 } else { 1.0 };
    let best = if c == 5 || s == 5 { 1.01 } else { 1.0 };
    100.0 * node * link * best
}

/// `p`'s fleet of `slow_node_2_and_link_1_4` run out, and the retests it was handed as
/// (step, client, server).
fn retests_of_slow_node_and_link(p: Plan) -> (Sim, Vec<(u32, u32, u32)>) {
    let mut sim = Sim::new(p);
    sim.gbps = slow_node_2_and_link_1_4;
    sim.start();
    let planned = p.steps().len() as u32;
    sim.run_out();
    assert!(sim.done);
    let retests = sim
        .handed
        .iter()
        .filter(|(s, _)| **s >= planned)
        .flat_map(|(s, v)| v.iter().map(move |&(c, v)| (*s, c, v)))
        .collect();
    (sim, retests)
}

#[test]
fn a_slow_node_and_a_slow_link_are_retested_after_the_plan_against_the_best_good_node() {
    let p = plan(6, Directions::Both, None);
    let planned = p.steps().len() as u32;
    let (sim, retests) = retests_of_slow_node_and_link(p);
    assert_eq!(retests, [(planned, 1, 4), (planned, 2, 5)], "node 2 against node 5, and link 1-4, in one step");
    let (o, printed) = sim.outcome();
    printed_once(&o, &printed);
    let mut kinds: Vec<String> = o.all_rows().iter().filter_map(|r| r.retest).map(|r| r.to_string()).collect();
    kinds.sort();
    assert_eq!(kinds, ["a retest of link 1 - 4", "a retest of node 2"]);
    let a = rows::judge(6, &o.all_rows(), &Thresholds::default());
    assert_eq!((a.bad_nodes(), a.bad_links()), (vec![2], vec![(1, 4)]), "both confirmed");
}

#[test]
fn retests_run_no_more_pairs_at_once_than_the_plan_allows() {
    // As above, under --max-pairs-per-round 1: the two retests are disjoint, yet each
    // gets a step of its own (two ping-pongs at once would measure the scheduler).
    let p = plan(6, Directions::One, Some(1));
    let planned = p.steps().len() as u32;
    let (_, retests) = retests_of_slow_node_and_link(p);
    assert_eq!(retests, [(planned, 2, 5), (planned + 1, 1, 4)], "one pair a step");
}

#[test]
fn a_live_node_that_failed_against_many_partners_is_retested_against_the_best_good_node() {
    let mut sim = Sim::new(plan(5, Directions::One, None));
    // Node 2's pairs all fail (a bad minute); it stays in the fleet.
    sim.gbps = |c, s| if c == 2 || s == 2 { f64::NAN } else { 100.0 };
    sim.start();
    sim.run_out();
    let (o, _) = sim.outcome();
    let retests: Vec<(u32, Option<Retest>)> =
        o.all_rows().iter().filter(|r| r.is_retest()).map(|r| (r.client, r.retest)).collect();
    assert!(retests.iter().any(|&(c, r)| c == 2 && r == Some(Retest::Node { node: 2 })), "{retests:?}");
}

#[test]
fn a_node_that_left_is_not_retested() {
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.start();
    let task = sim.tasks[2].take().unwrap();
    let _ = task;
    let a = sim.b.lost(2, "killed".into(), sim.now);
    sim.apply(a);
    sim.run_out();
    let (o, _) = sim.outcome();
    assert!(o.all_rows().iter().all(|r| !r.is_retest()));
    let a = rows::judge(4, &o.all_rows(), &Thresholds::default());
    assert_eq!(a.bad_nodes(), [2], "{:#?}", a.nodes);
}

#[test]
fn a_failed_pair_is_retested_against_the_same_peer_and_a_pair_of_a_node_that_left_is_not() {
    let p = plan(5, Directions::One, None);
    let mut sim = Sim::new(p);
    sim.start();
    let planned = p.steps().len() as u32;
    // Step 0: node 1's pair (1 -> 4) fails (a stalled ping-pong), everyone else's passes.
    let task = sim.tasks[1].take().unwrap();
    let mut row = sim.row_of(1, &task).unwrap();
    let stalled = crate::Error::Peer("peer node-4 made no progress for 5.0 s".into());
    (row.gbps, row.error) = (None, Some(PairError::of(&stalled, Some(Phase::Latency))));
    let failed_pair = (row.client, row.server);
    sim.printed.push(row.clone());
    sim.arrive(1, 1, vec![row]);
    sim.step_all();
    // Node 3 leaves in step 1: its pairs are not retested.
    if let Some(t) = sim.tasks[3].take() {
        let _ = t;
        let a = sim.b.lost(3, "killed".into(), sim.now);
        sim.apply(a);
    }
    sim.run_out();
    assert!(sim.done);
    let retests: Vec<(u32, u32)> =
        sim.handed.iter().filter(|(s, _)| **s >= planned).flat_map(|(_, v)| v.iter().copied()).collect();
    assert_eq!(retests, [failed_pair]);
    let (o, printed) = sim.outcome();
    printed_once(&o, &printed);
    let r = o.all_rows().into_iter().find(|r| r.is_retest()).unwrap();
    assert_eq!(r.retest, Some(Retest::Failed));
    let a = rows::judge(5, &o.all_rows(), &Thresholds::default());
    assert_eq!(a.flaky.len(), 1, "it passed its retest: flaky");
    assert_eq!(a.bad_nodes(), [3], "the node that left");
}

#[test]
fn a_server_sends_only_the_records_of_pairs_it_served() {
    let record = |step, client, server| ServedRow { step, client, server, counters: Default::default(), error: None };
    // A server of step 0 and its client: records of any other pair, side or step are forged.
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.start();
    let server = (0..4).find(|&i| matches!(sim.tasks[i as usize].as_ref().unwrap().work, Work::Serve { .. })).unwrap();
    let Work::Serve { client, .. } = sim.tasks[server as usize].as_ref().unwrap().work else { unreachable!() };
    let cases: [(&str, u32, ServedRow); 3] = [
        ("a pair it did not serve", server, record(0, server, client)),
        ("a pair another node served", client, record(0, client, server)),
        ("a step that is not over", server, record(9, client, server)),
    ];
    for (what, node, forged) in cases {
        let mut sim = Sim::new(plan(4, Directions::One, None));
        sim.start();
        let task = sim.tasks[node as usize].take().unwrap();
        let rows: Vec<PairRow> = sim.row_of(node, &task).into_iter().collect();
        let a = sim.b.arrive(node, 1, rows, vec![forged], sim.now);
        assert!(
            matches!(&a[0], Action::Dismiss { node: n, why } if *n == node && why.contains("did not serve")),
            "{what}: {a:?}"
        );
    }
    // The real record passes once, and a second copy is refused.
    sim.step_all();
    let task = sim.tasks[server as usize].take().unwrap();
    let a = sim.b.arrive(server, task.step + 1, Vec::new(), vec![record(0, client, server)], sim.now);
    assert!(a.iter().all(|a| !matches!(a, Action::Dismiss { .. })), "{a:?}");
    sim.apply(a);
    sim.step_all();
    let task = sim.tasks[server as usize].take().unwrap();
    let rows: Vec<PairRow> = sim.row_of(server, &task).into_iter().collect();
    let a = sim.b.arrive(server, task.step + 1, rows, vec![record(0, client, server)], sim.now);
    assert!(matches!(&a[0], Action::Dismiss { why, .. } if why.contains("or sent before")), "{a:?}");
    // The same record twice within one arrival is refused too.
    let mut sim = Sim::new(plan(4, Directions::One, None));
    sim.start();
    sim.step_all();
    let task = sim.tasks[server as usize].take().unwrap();
    let twice = vec![record(0, client, server), record(0, client, server)];
    let a = sim.b.arrive(server, task.step + 1, Vec::new(), twice, sim.now);
    assert!(matches!(&a[0], Action::Dismiss { why, .. } if why.contains("or sent before")), "{a:?}");
}
