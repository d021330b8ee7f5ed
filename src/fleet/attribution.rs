//! Which node or link of an all-pairs fleet is bad, from every pair's figures.
//!
//! Bandwidth: log(bw_ij) = mu + node_i + node_j + residual_ij, fitted by a median polish
//! for this symmetric model (each node's effect moves by the median of its residuals
//! until nothing moves), so a few bad pairs cannot drag the fit. A node is bad when its
//! effect, as a ratio to the typical node, is below `node_min_ratio`, when its robust
//! z-score (against the median and MAD of all effects) is below `node_min_z`, or when it
//! failed against at least `fail_share` of its partners. A link is bad when its residual,
//! as a ratio, is below `link_min_ratio` and its robust z-score (against the median and
//! MAD of all links' residuals) is below `link_min_z`, so a fleet's own noise does not
//! name links, or when the pair failed; and neither end is bad.
//! Latency: a pair is slow when its p50 is above `latency_max_ratio` times the fleet's
//! typical pair (the median of the pairs' p50: ClusterKit's 2.1x is against its best pair,
//! which one lucky pair sets); a node is slow when the median of its pairs is, a link when
//! it is and neither end is.
//! A pair that failed and passed its retest is flaky: judged by its retest's figures and
//! listed, and the fleet fails when more than `max_flaky_pairs` are.
//! Pure arithmetic on plain rows; tests give it matrices.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::rows::PairTable;
use crate::report::pairs::Retest;

/// The thresholds of the verdict (workload keys `[fleet]`, these defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    pub node_min_ratio: f64,
    pub node_min_z: f64,
    pub link_min_ratio: f64,
    pub link_min_z: f64,
    pub fail_share: f64,
    pub latency_max_ratio: f64,
    pub max_flaky_pairs: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            node_min_ratio: 0.93,
            node_min_z: -3.5,
            link_min_ratio: 0.93,
            link_min_z: -4.5,
            fail_share: 0.5,
            latency_max_ratio: 2.1,
            max_flaky_pairs: 0,
        }
    }
}

impl Thresholds {
    pub fn check(&self) -> Result<(), String> {
        let ratio = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(format!("{name} = {v}: use a ratio in (0, 1], like 0.93"))
            }
        };
        ratio("node_min_ratio", self.node_min_ratio)?;
        ratio("link_min_ratio", self.link_min_ratio)?;
        ratio("fail_share", self.fail_share)?;
        for (name, z) in [("node_min_z", self.node_min_z), ("link_min_z", self.link_min_z)] {
            if !(z.is_finite() && z < 0.0) {
                return Err(format!("{name} = {z}: use a negative z-score, like -3.5"));
            }
        }
        if !(self.latency_max_ratio.is_finite() && self.latency_max_ratio > 1.0) {
            return Err(format!("latency_max_ratio = {}: use a ratio above 1, like 2.1", self.latency_max_ratio));
        }
        Ok(())
    }
}

/// One measured direction of a pair, as the verdict sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub client: u32,
    pub server: u32,
    /// Median bandwidth, Gb/s (None: not measured or failed).
    pub gbps: Option<f64>,
    /// Median latency p50, us.
    pub p50_us: Option<f64>,
    /// Why the pair failed, if it did.
    pub error: Option<String>,
    /// The node of the pair that left the fleet, when that is why it failed: the failure
    /// counts against that node only.
    pub left: Option<u32>,
    /// A retest after the planned rounds, and of what (`judge` weighs it; the fit leaves
    /// it out).
    pub retest: Option<Retest>,
}

/// The smallest spread of node effects (log units) a z-score divides by: a fleet whose
/// nodes agree to within measurement noise would otherwise call a 0.5 % difference bad.
pub const MIN_SPREAD: f64 = 0.005;

/// What a retest found, and whether that confirms its suspect or clears it.
#[derive(Debug, Clone, PartialEq)]
pub struct RetestFinding {
    pub confirmed: bool,
    pub client: u32,
    pub server: u32,
    pub result: RetestResult,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RetestResult {
    Failed(String),
    /// The retest's partner left the fleet while it ran: it tells nothing about the
    /// suspect, which keeps the verdict of its planned pairs.
    Inconclusive(String),
    /// Bandwidth against what was expected of the pair, its latency p50 (us), and whether
    /// that was slow: every figure the retest judged.
    Figures {
        ratio: Option<f64>,
        p50_us: Option<f64>,
        slow: bool,
    },
}

impl fmt::Display for RetestFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, s) = (self.client, self.server);
        let verdict = match (&self.result, self.confirmed) {
            (RetestResult::Inconclusive(_), _) => "inconclusive",
            (_, true) => "confirmed",
            (_, false) => "cleared",
        };
        write!(f, "{verdict}: ")?;
        match &self.result {
            RetestResult::Failed(e) => write!(f, "retest {c} -> {s} failed: {e}"),
            RetestResult::Inconclusive(e) => write!(f, "retest {c} -> {s} failed because its partner left: {e}"),
            RetestResult::Figures { ratio, p50_us, slow } => {
                write!(f, "retest {c} -> {s}: ")?;
                match ratio {
                    Some(r) => write!(f, "bandwidth {r:.3}x the expected")?,
                    None => write!(f, "no bandwidth figure")?,
                }
                match p50_us {
                    Some(p) => write!(f, ", latency p50 {p:.1} us{}", if *slow { " (slow)" } else { "" }),
                    None => write!(f, ", no latency figure"),
                }
            }
        }
    }
}

/// Why a node is suspect (bad unless a retest cleared it).
#[derive(Debug, Clone, PartialEq)]
pub enum NodeReason {
    Bandwidth {
        ratio: f64,
        limit: f64,
    },
    ZScore {
        z: f64,
        limit: f64,
    },
    Failures {
        failed: u32,
        partners: u32,
    },
    Latency {
        p50_us: f64,
        ratio: f64,
        limit: f64,
    },
    /// It left the fleet (the barrier's words: when, and why): bad for leaving, and its
    /// pairs' failures make no link bad.
    Left {
        why: String,
    },
    Retest(RetestFinding),
}

impl NodeReason {
    /// A measured slowness (not failures alone), which a retest against a known-good peer
    /// can confirm or clear.
    pub fn is_slowness(&self) -> bool {
        matches!(self, NodeReason::Bandwidth { .. } | NodeReason::ZScore { .. } | NodeReason::Latency { .. })
    }

    /// Whether a retest against a known-good peer can tell: a slowness, or failures
    /// against many partners (a bad minute passes, a bad node fails again).
    pub fn is_retestable(&self) -> bool {
        self.is_slowness() || self.is_failures()
    }

    /// Failures against half of its partners or more.
    pub fn is_failures(&self) -> bool {
        matches!(self, NodeReason::Failures { .. })
    }
}

impl fmt::Display for NodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeReason::Bandwidth { ratio, limit } => {
                write!(f, "bandwidth {ratio:.3}x the typical node's (below {limit})")
            }
            NodeReason::ZScore { z, limit } => write!(f, "robust z-score {z:.1} (below {limit})"),
            NodeReason::Failures { failed, partners } => {
                write!(f, "failed against {failed} of its {partners} partners")
            }
            NodeReason::Latency { p50_us, ratio, limit } => {
                write!(f, "latency p50 {p50_us:.1} us, {ratio:.2}x the fleet's typical pair (above {limit})")
            }
            NodeReason::Left { why } => f.write_str(why),
            NodeReason::Retest(r) => r.fmt(f),
        }
    }
}

/// Why a link is suspect (bad unless one of its nodes is, or a retest cleared it).
#[derive(Debug, Clone, PartialEq)]
pub enum LinkReason {
    Failed { client: u32, server: u32, error: String },
    Bandwidth { ratio: f64, limit: f64, z: f64 },
    Latency { p50_us: f64, ratio: f64 },
    Retest(RetestFinding),
}

impl fmt::Display for LinkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkReason::Failed { client, server, error } => write!(f, "{client} -> {server} failed: {error}"),
            LinkReason::Bandwidth { ratio, limit, z } => {
                write!(f, "bandwidth {ratio:.3}x what its two nodes predict (below {limit}), robust z-score {z:.1}")
            }
            LinkReason::Latency { p50_us, ratio } => {
                write!(f, "latency p50 {p50_us:.1} us, {ratio:.2}x the fleet's typical pair")
            }
            LinkReason::Retest(r) => r.fmt(f),
        }
    }
}

/// Reasons are written as their sentences in the verdict's JSON.
fn as_sentences<S: serde::Serializer, R: fmt::Display>(reasons: &[R], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(reasons.iter().map(|r| r.to_string()))
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeVerdict {
    pub node: u32,
    /// exp(node effect): the node's bandwidth against the typical node's.
    pub ratio: Option<f64>,
    pub z: Option<f64>,
    pub partners: u32,
    pub failed_partners: u32,
    /// Median p50 of its pairs, us.
    pub p50_us: Option<f64>,
    pub bad: bool,
    #[serde(serialize_with = "as_sentences")]
    pub reasons: Vec<NodeReason>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkVerdict {
    pub a: u32,
    pub b: u32,
    /// exp(residual): the link's bandwidth against what its two nodes predict.
    pub ratio: Option<f64>,
    /// The residual's robust z-score against every link's.
    pub z: Option<f64>,
    pub gbps: Option<f64>,
    pub p50_us: Option<f64>,
    pub bad: bool,
    #[serde(serialize_with = "as_sentences")]
    pub reasons: Vec<LinkReason>,
}

/// The fleet's verdict: pass when no node and no link is bad. Decided here and nowhere
/// else (node 0, `summarize` and every output ask [`Attribution::verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
        })
    }
}

/// A pair that failed in its planned step and passed its retest: a one-off, which an
/// acceptance run still reports (a link that dropped a ping-pong once may do it again).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlakyPair {
    pub client: u32,
    pub server: u32,
    /// The planned measurement's error.
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    /// exp(mu): the typical pair's bandwidth, Gb/s.
    pub typical_gbps: Option<f64>,
    /// The fleet's typical pair p50 (the median of the pairs'), us.
    pub typical_p50_us: Option<f64>,
    pub nodes: Vec<NodeVerdict>,
    /// Every link measured (both directions folded), bad or not, by (a, b) with a < b.
    pub links: Vec<LinkVerdict>,
    /// Pairs that failed once and passed their retest.
    pub flaky: Vec<FlakyPair>,
    /// How many flaky pairs the fleet may have and pass (`max_flaky_pairs`).
    pub flaky_allowed: u32,
}

impl Attribution {
    pub fn bad_nodes(&self) -> Vec<u32> {
        self.nodes.iter().filter(|n| n.bad).map(|n| n.node).collect()
    }

    pub fn bad_links(&self) -> Vec<(u32, u32)> {
        self.links.iter().filter(|l| l.bad).map(|l| (l.a, l.b)).collect()
    }

    pub fn too_flaky(&self) -> bool {
        self.flaky.len() > self.flaky_allowed as usize
    }

    pub fn verdict(&self) -> Verdict {
        if self.nodes.iter().any(|n| n.bad) || self.links.iter().any(|l| l.bad) || self.too_flaky() {
            Verdict::Fail
        } else {
            Verdict::Pass
        }
    }

    /// The link of nodes `x` and `y`, either way round (links are sorted by (a, b)).
    /// Node `x` left the fleet (`why`, the barrier's words): bad for leaving, and no link
    /// of it is bad (a link is judged only between two good nodes).
    pub fn mark_left(&mut self, x: u32, why: &str) {
        let Some(v) = self.nodes.get_mut(x as usize) else { return };
        if !v.reasons.iter().any(|r| matches!(r, NodeReason::Left { .. })) {
            v.reasons.push(NodeReason::Left { why: why.to_string() });
        }
        v.bad = true;
        for l in self.links.iter_mut().filter(|l| l.a == x || l.b == x) {
            l.bad = false;
        }
    }

    fn link_mut(&mut self, x: u32, y: u32) -> Option<&mut LinkVerdict> {
        let key = (x.min(y), x.max(y));
        let at = self.links.binary_search_by(|l| (l.a, l.b).cmp(&key)).ok()?;
        Some(&mut self.links[at])
    }
}

/// The median (the mean of the middle two for an even count); reorders `v`. Linear time.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let (len, m) = (v.len(), v.len() / 2);
    let (lower, upper, _) = v.select_nth_unstable_by(m, f64::total_cmp);
    let upper = *upper;
    if len % 2 == 1 {
        return Some(upper);
    }
    let below = lower.iter().copied().max_by(f64::total_cmp).unwrap_or(upper);
    Some((below + upper) / 2.0)
}

/// When the polish has converged: no effect moved by more than this in a sweep. A
/// millionth in log units is 0.0001 % of bandwidth, far below what any threshold tells
/// apart; the polish of a noisy fleet creeps by less than that for dozens of sweeps.
const CONVERGED: f64 = 1e-6;

/// The fit: mu and each node's effect (None: no working pair). `adj[i]`: the indexes of
/// node i's observations, so each sweep costs the observations, not nodes x observations.
fn polish(n: usize, obs: &[(usize, usize, f64)]) -> (f64, Vec<Option<f64>>) {
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (k, o) in obs.iter().enumerate() {
        adj[o.0].push(k as u32);
        adj[o.1].push(k as u32);
    }
    let has: Vec<bool> = adj.iter().map(|a| !a.is_empty()).collect();
    let mut scratch: Vec<f64> = obs.iter().map(|o| o.2).collect();
    let mut mu = median(&mut scratch).unwrap_or(0.0);
    let mut e = vec![0.0; n];
    for _ in 0..100 {
        let mut moved: f64 = 0.0;
        for i in (0..n).filter(|&i| has[i]) {
            scratch.clear();
            scratch.extend(adj[i].iter().map(|&k| {
                let (a, b, y) = obs[k as usize];
                y - mu - e[a] - e[b]
            }));
            let step = median(&mut scratch).unwrap_or(0.0);
            e[i] += step;
            moved = moved.max(step.abs());
        }
        // Keep the typical node at 0: a shift c of every effect is 2c of mu.
        scratch.clear();
        scratch.extend((0..n).filter(|&i| has[i]).map(|i| e[i]));
        let c = median(&mut scratch).unwrap_or(0.0);
        e.iter_mut().for_each(|x| *x -= c);
        mu += 2.0 * c;
        scratch.clear();
        scratch.extend(obs.iter().map(|&(a, b, y)| y - mu - e[a] - e[b]));
        let m = median(&mut scratch).unwrap_or(0.0);
        mu += m;
        if moved.max(m.abs()) < CONVERGED {
            break;
        }
    }
    (mu, (0..n).map(|i| has[i].then_some(e[i])).collect())
}

/// The final verdict: [`attribute`] on the planned pairs, then each suspect's retests.
/// A suspect node stays bad when its retest against a known-good peer fails or is still
/// below `node_min_ratio` of what that peer's typical pair gives (or still slow), and is
/// cleared when it is not; a node suspect for its failures that is cleared leaves its
/// failed pairs flaky. A suspect link likewise against what its two nodes predict. A
/// suspect without a retest keeps its verdict.
pub fn judge(n: u32, rows: &[Observation], t: &Thresholds) -> Attribution {
    judge_owned(n, rows.to_vec(), t)
}

/// [`judge`], taking the observations (node 0's half a million, not copied).
pub fn judge_owned(n: u32, rows: Vec<Observation>, t: &Thresholds) -> Attribution {
    // A failed pair that passed its retest is judged by the retest's figures, and flaky.
    let (mut planned, rows): (Vec<Observation>, Vec<Observation>) = rows.into_iter().partition(|r| r.retest.is_none());
    let mut table = PairTable::new(n);
    for (k, r) in planned.iter().enumerate() {
        table.insert_first(r.client, r.server, k);
    }
    let mut flaky = Vec::new();
    let mut failed_again = Vec::new();
    // A retest that failed because a node left tells nothing of the pair (the node is
    // bad for leaving).
    for r in rows.iter().filter(|r| r.retest == Some(Retest::Failed) && r.left.is_none()) {
        let Some(k) = table.get(r.client, r.server) else { continue };
        let p = &mut planned[k];
        match (&p.error, &r.error) {
            (Some(_), None) => {
                let error = p.error.take().unwrap_or_default();
                (p.gbps, p.p50_us) = (r.gbps, r.p50_us);
                flaky.push(FlakyPair { client: r.client, server: r.server, error });
            }
            (Some(_), Some(e)) => failed_again.push((r.client, r.server, e.clone())),
            (None, _) => {}
        }
    }
    let mut a = attribute(n, &planned, t);
    a.flaky = flaky;
    for (c, s, e) in failed_again {
        if let Some(l) = a.link_mut(c, s) {
            let finding = RetestFinding { confirmed: true, client: c, server: s, result: RetestResult::Failed(e) };
            l.reasons.push(LinkReason::Retest(finding));
        }
    }
    // A node that left during the retests is bad for leaving too.
    for r in rows.iter().filter(|r| r.retest.is_some()) {
        if let (Some(x), Some(why)) = (r.left, &r.error) {
            a.mark_left(x, why);
        }
    }
    let (mu, typical) = (a.typical_gbps, a.typical_p50_us);
    let effects: Vec<Option<f64>> = a.nodes.iter().map(|x| x.ratio).collect();
    for r in rows {
        let Some(retest) = r.retest else { continue };
        let (c, s) = (r.client as usize, r.server as usize);
        if c >= a.nodes.len() || s >= a.nodes.len() {
            continue;
        }
        // A node against its known-good peer's typical pair; a link against its two nodes.
        let (expected, limit) = match retest {
            Retest::Node { node } => {
                let peer = if node as usize == c { s } else { c };
                (mu.zip(effects[peer]).map(|(m, g)| m * g), t.node_min_ratio)
            }
            Retest::Link { .. } => {
                (mu.zip(effects[s]).map(|(m, g)| m * g * effects[c].unwrap_or(1.0)), t.link_min_ratio)
            }
            Retest::Failed => continue,
        };
        let ratio = r.gbps.zip(expected).map(|(g, e)| g / e);
        let slow = r.p50_us.zip(typical).is_some_and(|(p, b)| p > t.latency_max_ratio * b);
        // The suspect's partner left mid-retest: no finding either way.
        let suspect = match retest {
            Retest::Node { node } => Some(node),
            _ => None,
        };
        let partner_left = r.left.is_some_and(|x| Some(x) != suspect);
        let confirmed = !partner_left && (r.error.is_some() || ratio.is_some_and(|x| x < limit) || slow);
        let result = match &r.error {
            Some(e) if partner_left => RetestResult::Inconclusive(e.clone()),
            Some(e) => RetestResult::Failed(e.clone()),
            None => RetestResult::Figures { ratio, p50_us: r.p50_us, slow },
        };
        let finding = RetestFinding { confirmed, client: r.client, server: r.server, result };
        match retest {
            Retest::Node { node } => {
                let Some(v) = a.nodes.get_mut(node as usize).filter(|v| v.bad) else { continue };
                v.reasons.push(NodeReason::Retest(finding));
                if partner_left {
                    continue;
                }
                v.bad = confirmed;
                // A live node that failed against many partners and passes against a
                // known-good one had a bad minute: its failed pairs are flaky, not bad.
                let failed_many = v.reasons.iter().any(NodeReason::is_failures);
                if !confirmed && failed_many {
                    for p in planned.iter().filter(|p| p.error.is_some() && (p.client == node || p.server == node)) {
                        if !a.flaky.iter().any(|f| (f.client, f.server) == (p.client, p.server)) {
                            let error = p.error.clone().unwrap_or_default();
                            a.flaky.push(FlakyPair { client: p.client, server: p.server, error });
                        }
                    }
                }
            }
            Retest::Link { a: x, b: y } => {
                if let Some(l) = a.link_mut(x, y).filter(|l| l.bad) {
                    l.reasons.push(LinkReason::Retest(finding));
                    if !partner_left {
                        l.bad = confirmed;
                    }
                }
            }
            Retest::Failed => {}
        }
    }
    a
}

/// The verdict on `n` nodes from every observation (retests left out). Each pair is
/// looked up in an N x N table: the cost is the observations'.
pub fn attribute(n: u32, rows: &[Observation], t: &Thresholds) -> Attribution {
    let planned: Vec<&Observation> = rows.iter().filter(|r| r.retest.is_none()).collect();
    let mut table = PairTable::new(n);
    for (k, r) in planned.iter().enumerate() {
        table.insert_first(r.client, r.server, k);
    }
    let n = n as usize;
    // Each pair of a node once, both directions: (partner, observation).
    let table = &table;
    let pairs_of = |i: usize| {
        (0..n as u32).flat_map(move |j| {
            [table.get(i as u32, j), table.get(j, i as u32)].into_iter().flatten().map(move |k| (j, k))
        })
    };
    let obs: Vec<(usize, usize, f64)> = planned
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| r.gbps.filter(|g| *g > 0.0).map(|g| (r.client as usize, r.server as usize, g.ln())))
        .filter(|o| o.0 < n && o.1 < n)
        .collect();
    let (mu, effects) = polish(n, &obs);
    let fitted: Vec<f64> = effects.iter().flatten().copied().collect();
    let centre = median(&mut fitted.clone()).unwrap_or(0.0);
    let mad = median(&mut fitted.iter().map(|e| (e - centre).abs()).collect::<Vec<_>>()).unwrap_or(0.0);
    let spread = (1.4826 * mad).max(MIN_SPREAD);
    let typical_p50 = median(
        &mut planned
            .iter()
            .filter(|r| r.error.is_none())
            .filter_map(|r| r.p50_us)
            .filter(|p| *p > 0.0)
            .collect::<Vec<_>>(),
    );

    // Who left the fleet, in the barrier's words (the first row that says so).
    let mut departed = std::collections::BTreeMap::new();
    for r in &planned {
        if let (Some(x), Some(why)) = (r.left, &r.error) {
            departed.entry(x).or_insert_with(|| why.clone());
        }
    }
    let mut nodes: Vec<NodeVerdict> = (0..n)
        .map(|i| {
            let (mut partners, mut failed) = (0u32, 0u32);
            let mut p50 = Vec::new();
            let mut last: Option<(u32, bool)> = None;
            for (j, k) in pairs_of(i) {
                let r = planned[k];
                let bad = r.error.is_some() && r.left.is_none_or(|x| x == i as u32);
                if r.error.is_none() {
                    p50.extend(r.p50_us);
                }
                // Both directions of a partner come one after the other: count it once.
                match last {
                    Some((lj, lbad)) if lj == j => {
                        if bad && !lbad {
                            failed += 1;
                        }
                        last = Some((j, lbad || bad));
                    }
                    _ => {
                        partners += 1;
                        failed += bad as u32;
                        last = Some((j, bad));
                    }
                }
            }
            let p50 = median(&mut p50);
            let ratio = effects[i].map(f64::exp);
            let z = effects[i].map(|e| (e - centre) / spread);
            let mut reasons = Vec::new();
            if let Some(r) = ratio.filter(|r| *r < t.node_min_ratio) {
                reasons.push(NodeReason::Bandwidth { ratio: r, limit: t.node_min_ratio });
            }
            if let Some(z) = z.filter(|z| *z < t.node_min_z) {
                reasons.push(NodeReason::ZScore { z, limit: t.node_min_z });
            }
            if partners > 0 && failed as f64 >= t.fail_share * partners as f64 {
                reasons.push(NodeReason::Failures { failed, partners });
            }
            if let (Some(p), Some(typical)) = (p50, typical_p50)
                && p > t.latency_max_ratio * typical
            {
                reasons.push(NodeReason::Latency { p50_us: p, ratio: p / typical, limit: t.latency_max_ratio });
            }
            if let Some(why) = departed.get(&(i as u32)) {
                reasons.push(NodeReason::Left { why: why.clone() });
            }
            NodeVerdict {
                node: i as u32,
                ratio,
                z,
                partners,
                failed_partners: failed,
                p50_us: p50,
                bad: !reasons.is_empty(),
                reasons,
            }
        })
        .collect();

    let slow_node = |p: Option<f64>, typical: f64| p.is_some_and(|x| x > t.latency_max_ratio * typical);
    // Each link's figures, then its residual's z-score against every link's.
    struct Fold<'a> {
        a: u32,
        b: u32,
        /// Its one or two directions (no allocation: a thousand nodes have half a million
        /// links).
        both: [Option<&'a Observation>; 2],
        gbps: Option<f64>,
        p50: Option<f64>,
        residual: Option<f64>,
    }
    let mut folds = Vec::with_capacity(n * n.saturating_sub(1) / 2);
    for a in 0..n as u32 {
        for b in a + 1..n as u32 {
            let both = [table.get(a, b), table.get(b, a)].map(|k| k.map(|k| planned[k]));
            if both.iter().all(Option::is_none) {
                continue;
            }
            let good = || both.iter().flatten().filter(|r| r.error.is_none());
            let gbps = median(&mut good().filter_map(|r| r.gbps).collect::<Vec<_>>());
            let p50 = median(&mut good().filter_map(|r| r.p50_us).collect::<Vec<_>>());
            let residual = match (gbps.filter(|g| *g > 0.0), effects[a as usize], effects[b as usize]) {
                (Some(g), Some(ea), Some(eb)) => Some(g.ln() - mu - ea - eb),
                _ => None,
            };
            folds.push(Fold { a, b, both, gbps, p50, residual });
        }
    }
    let residuals: Vec<f64> = folds.iter().filter_map(|f| f.residual).collect();
    let link_centre = median(&mut residuals.clone()).unwrap_or(0.0);
    let link_mad = median(&mut residuals.iter().map(|r| (r - link_centre).abs()).collect::<Vec<_>>()).unwrap_or(0.0);
    let link_spread = (1.4826 * link_mad).max(MIN_SPREAD);
    let links = folds
        .into_iter()
        .map(|f| {
            let (a, b) = (f.a, f.b);
            let ratio = f.residual.map(f64::exp);
            let z = f.residual.map(|r| (r - link_centre) / link_spread);
            let ends_bad = nodes[a as usize].bad || nodes[b as usize].bad;
            let mut reasons = Vec::new();
            // A pair that failed because a node left is that node's, never its link's.
            for r in f.both.iter().flatten().filter(|r| r.error.is_some() && r.left.is_none()) {
                let error = r.error.clone().unwrap_or_default();
                reasons.push(LinkReason::Failed { client: r.client, server: r.server, error });
            }
            if let (Some(r), Some(z)) = (ratio, z)
                && r < t.link_min_ratio
                && z < t.link_min_z
            {
                reasons.push(LinkReason::Bandwidth { ratio: r, limit: t.link_min_ratio, z });
            }
            if let (Some(p), Some(typical)) = (f.p50, typical_p50)
                && p > t.latency_max_ratio * typical
                && !(slow_node(nodes[a as usize].p50_us, typical) || slow_node(nodes[b as usize].p50_us, typical))
            {
                reasons.push(LinkReason::Latency { p50_us: p, ratio: p / typical });
            }
            LinkVerdict { a, b, ratio, z, gbps: f.gbps, p50_us: f.p50, bad: !reasons.is_empty() && !ends_bad, reasons }
        })
        .collect();
    nodes.iter_mut().for_each(|n| n.reasons.dedup());
    Attribution {
        typical_gbps: (!obs.is_empty()).then(|| mu.exp()),
        typical_p50_us: typical_p50,
        nodes,
        links,
        flaky: Vec::new(),
        flaky_allowed: t.max_flaky_pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every direction of every pair of `n` nodes, bandwidth from `bw(i, j)`.
    fn fleet(n: u32, bw: impl Fn(u32, u32) -> f64) -> Vec<Observation> {
        let mut rows = Vec::new();
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    rows.push(Observation {
                        client: i,
                        server: j,
                        gbps: Some(bw(i, j)),
                        p50_us: Some(10.0),
                        error: None,
                        left: None,
                        retest: None,
                    });
                }
            }
        }
        rows
    }

    /// A little deterministic noise (+-2 %).
    fn noise(i: u32, j: u32) -> f64 {
        1.0 + 0.02 * (((i * 7 + j * 13) % 5) as f64 - 2.0) / 2.0
    }

    #[test]
    fn a_uniform_fleet_has_no_bad_node_or_link() {
        let a = attribute(6, &fleet(6, |i, j| 100.0 * noise(i, j)), &Thresholds::default());
        assert!(a.bad_nodes().is_empty() && a.bad_links().is_empty(), "{a:#?}");
        assert!((a.typical_gbps.unwrap() / 100.0 - 1.0).abs() < 0.03);
    }

    #[test]
    fn a_slow_node_is_named_and_its_links_are_not() {
        let a = attribute(
            7,
            &fleet(7, |i, j| 100.0 * noise(i, j) * if i == 3 || j == 3 { 0.5 } else { 1.0 }),
            &Thresholds::default(),
        );
        assert_eq!(a.bad_nodes(), [3], "{a:#?}");
        assert!(a.bad_links().is_empty(), "the slow node's links are its own fault: {:?}", a.bad_links());
        let n3 = &a.nodes[3];
        assert!(
            (n3.ratio.unwrap() - 0.5).abs() < 0.05 && matches!(n3.reasons[0], NodeReason::Bandwidth { .. }),
            "{n3:?}"
        );
    }

    #[test]
    fn one_slow_path_is_a_bad_link_not_a_node() {
        let a = attribute(
            6,
            &fleet(6, |i, j| 100.0 * noise(i, j) * if (i, j) == (1, 4) { 0.4 } else { 1.0 }),
            &Thresholds::default(),
        );
        assert!(a.bad_nodes().is_empty(), "{:?}", a.nodes);
        assert_eq!(a.bad_links(), [(1, 4)]);
    }

    #[test]
    fn a_node_that_fails_against_half_its_partners_is_bad_and_the_rest_stay_good() {
        let mut rows = fleet(5, |i, j| 100.0 * noise(i, j));
        for r in rows.iter_mut().filter(|r| r.client == 2 || r.server == 2) {
            r.gbps = None;
            r.error = Some("peer lost".into());
        }
        let a = attribute(5, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [2], "{a:#?}");
        assert!(a.nodes[2].reasons.contains(&NodeReason::Failures { failed: 4, partners: 4 }), "{:?}", a.nodes[2]);
        assert_eq!(a.nodes[2].reasons[0].to_string(), "failed against 4 of its 4 partners");
        assert!(a.bad_links().is_empty(), "the dead node's links are its own: {:?}", a.bad_links());
    }

    #[test]
    fn a_small_dip_in_a_tight_fleet_is_caught_by_the_z_score() {
        let a =
            attribute(8, &fleet(8, |i, j| 100.0 * if i == 5 || j == 5 { 0.95 } else { 1.0 }), &Thresholds::default());
        assert_eq!(a.bad_nodes(), [5]);
        assert!(
            a.nodes[5].reasons.iter().all(|r| matches!(r, NodeReason::ZScore { .. })),
            "0.95x passes the ratio: {:?}",
            a.nodes[5]
        );
    }

    #[test]
    fn latency_above_2_1x_the_typical_pair_names_the_node_or_the_link() {
        let mut rows = fleet(5, |_, _| 100.0);
        for r in rows.iter_mut().filter(|r| r.client == 4 || r.server == 4) {
            r.p50_us = Some(30.0);
        }
        let a = attribute(5, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [4]);
        assert!(a.bad_links().is_empty());
        let mut rows = fleet(5, |_, _| 100.0);
        rows.iter_mut()
            .filter(|r| (r.client.min(r.server), r.client.max(r.server)) == (0, 2))
            .for_each(|r| r.p50_us = Some(25.0));
        let a = attribute(5, &rows, &Thresholds::default());
        assert!(a.bad_nodes().is_empty());
        assert_eq!(a.bad_links(), [(0, 2)]);
    }

    #[test]
    fn a_retest_confirms_a_suspect_or_clears_it() {
        let slow = |i: u32, j: u32| 100.0 * noise(i, j) * if i == 3 || j == 3 { 0.5 } else { 1.0 };
        let retest = |gbps: f64| Observation {
            client: 3,
            server: 0,
            gbps: Some(gbps),
            p50_us: Some(10.0),
            error: None,
            left: None,
            retest: Some(Retest::Node { node: 3 }),
        };
        let mut rows = fleet(6, slow);
        rows.push(retest(48.0));
        let a = judge(6, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [3]);
        assert!(
            a.nodes[3].reasons.last().unwrap().to_string().starts_with("confirmed: retest 3 -> 0"),
            "{:?}",
            a.nodes[3]
        );
        let mut rows = fleet(6, slow);
        rows.push(retest(101.0));
        let a = judge(6, &rows, &Thresholds::default());
        assert!(a.bad_nodes().is_empty(), "did not reproduce: {:?}", a.nodes[3]);
        assert!(a.nodes[3].reasons.last().unwrap().to_string().starts_with("cleared"));
        assert_eq!(a.verdict(), Verdict::Pass);
    }

    #[test]
    fn thresholds_out_of_range_are_refused() {
        assert!(Thresholds::default().check().is_ok());
        assert!(Thresholds { node_min_ratio: 1.5, ..Default::default() }.check().unwrap_err().contains("(0, 1]"));
        assert!(Thresholds { node_min_z: 2.0, ..Default::default() }.check().is_err());
        assert!(Thresholds { latency_max_ratio: 0.5, ..Default::default() }.check().is_err());
    }

    #[test]
    fn one_lucky_pair_does_not_make_a_healthy_fleet_slow() {
        let mut rows = fleet(6, |i, j| 100.0 * noise(i, j));
        rows[7].p50_us = Some(3.0);
        let a = attribute(6, &rows, &Thresholds::default());
        assert_eq!(a.typical_p50_us, Some(10.0));
        assert_eq!(a.verdict(), Verdict::Pass, "against the best pair (3 us) every pair would be 3.3x: {a:#?}");
    }

    /// A normal deviate from a xorshift state (Box-Muller).
    fn gauss(state: &mut u64) -> f64 {
        let mut uniform = || {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (u, v) = (uniform(), uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    #[test]
    fn noisy_fleets_name_no_false_link_and_still_name_a_link_at_0_7x() {
        let mut state = 0x1234_5678_9abc_def1u64;
        let (trials, mut false_links, mut false_nodes) = (40, 0, 0);
        for trial in 0..trials {
            // 64 nodes, both directions; each pair's figure is the median of 3 repeats that
            // vary by 5 % (one sigma), as a fleet measures it.
            let mut rows = fleet(64, |_, _| 100.0);
            for r in rows.iter_mut() {
                let mut repeats: Vec<f64> = (0..3).map(|_| 100.0 * (0.05 * gauss(&mut state)).exp()).collect();
                r.gbps = median(&mut repeats);
            }
            let a = attribute(64, &rows, &Thresholds::default());
            false_links += a.bad_links().len();
            false_nodes += a.bad_nodes().len();
            // The same fleet with link 10 - 20 at 0.7x, both ways.
            for r in rows.iter_mut().filter(|r| (r.client.min(r.server), r.client.max(r.server)) == (10, 20)) {
                r.gbps = r.gbps.map(|g| g * 0.7);
            }
            let a = attribute(64, &rows, &Thresholds::default());
            assert!(a.bad_links().contains(&(10, 20)), "trial {trial}: the 0.7x link not named: {:?}", a.links[0]);
        }
        eprintln!("{false_links} false links in {trials} noisy healthy fleets");
        assert!(false_links <= 1, "{false_links} false links in {trials} noisy healthy fleets");
        assert_eq!(false_nodes, 0, "false nodes in {trials} noisy healthy fleets");
    }

    #[test]
    fn a_live_node_that_failed_against_many_partners_is_cleared_by_a_passing_retest_and_its_pairs_are_flaky() {
        // Node 2 had a bad minute: its pairs with nodes 0, 1 and 4 failed (3 of 5 partners).
        let mut rows = fleet(6, |i, j| 100.0 * noise(i, j));
        let bad_minute = |r: &Observation| r.client == 2 && [0, 1, 4].contains(&r.server);
        for r in rows.iter_mut().filter(|r| bad_minute(r)) {
            (r.gbps, r.p50_us, r.error) = (None, None, Some("remote invalid request error (9)".into()));
        }
        let a = judge(6, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [2], "named for its failures until retested");
        assert!(a.bad_links().is_empty(), "its failed pairs are the node's: {:?}", a.bad_links());
        let retest = |error: Option<&str>| Observation {
            client: 2,
            server: 5,
            gbps: error.is_none().then_some(101.0),
            p50_us: error.is_none().then_some(10.5),
            error: error.map(String::from),
            left: None,
            retest: Some(Retest::Node { node: 2 }),
        };
        let mut cleared = rows.clone();
        cleared.push(retest(None));
        let a = judge(6, &cleared, &Thresholds::default());
        assert!(a.bad_nodes().is_empty() && a.bad_links().is_empty(), "{:#?}", a.nodes[2]);
        let flaky: Vec<(u32, u32)> = a.flaky.iter().map(|f| (f.client, f.server)).collect();
        assert_eq!(flaky, [(2, 0), (2, 1), (2, 4)], "one bad minute makes flaky pairs, not a bad node");
        assert_eq!(a.verdict(), Verdict::Fail, "max_flaky_pairs 0 still fails the fleet");
        let text = a.nodes[2].reasons.last().unwrap().to_string();
        assert!(
            text.starts_with("cleared: retest 2 -> 5: bandwidth") && text.contains("latency p50 10.5 us"),
            "{text}"
        );
        let mut confirmed = rows.clone();
        confirmed.push(retest(Some("remote invalid request error (9)")));
        let a = judge(6, &confirmed, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [2]);
        assert!(a.flaky.is_empty(), "{:?}", a.flaky);
        assert!(a.nodes[2].reasons.last().unwrap().to_string().starts_with("confirmed: retest 2 -> 5 failed"));
    }

    #[test]
    fn a_failed_pair_that_passes_its_retest_is_flaky_and_one_that_fails_again_stays_failed() {
        let failed = |r: &mut Observation| {
            (r.gbps, r.p50_us, r.error) = (None, None, Some("made no progress for 5.0 s".into()));
        };
        let mut rows = fleet(5, |i, j| 100.0 * noise(i, j));
        rows.iter_mut().filter(|r| (r.client, r.server) == (1, 3)).for_each(failed);
        let retest = |error: Option<&str>| Observation {
            client: 1,
            server: 3,
            gbps: error.is_none().then_some(99.0),
            p50_us: error.is_none().then_some(10.0),
            error: error.map(String::from),
            left: None,
            retest: Some(Retest::Failed),
        };
        let mut passed = rows.clone();
        passed.push(retest(None));
        let a = judge(5, &passed, &Thresholds::default());
        assert!(a.bad_nodes().is_empty() && a.bad_links().is_empty(), "{a:#?}");
        assert_eq!(a.flaky, [FlakyPair { client: 1, server: 3, error: "made no progress for 5.0 s".into() }]);
        assert_eq!(a.verdict(), Verdict::Fail, "max_flaky_pairs 0: an acceptance run does not hide it");
        let lenient = Thresholds { max_flaky_pairs: 1, ..Default::default() };
        assert_eq!(judge(5, &passed, &lenient).verdict(), Verdict::Pass);
        let mut again = rows;
        again.push(retest(Some("made no progress again")));
        let a = judge(5, &again, &Thresholds::default());
        assert_eq!(a.bad_links(), [(1, 3)]);
        assert!(a.flaky.is_empty());
        let link = a.links.iter().find(|l| (l.a, l.b) == (1, 3)).unwrap();
        assert_eq!(link.reasons.last().unwrap().to_string(), "confirmed: retest 1 -> 3 failed: made no progress again");
    }

    #[test]
    fn a_node_killed_just_before_half_its_partners_is_named_alone_and_no_link_is_bad() {
        // 10 nodes: node 6 measured 5 of its 9 partners, then was killed; the coordinator
        // wrote its last 4 pairs failed for its leaving. 4 of 9 is below fail_share.
        let mut rows = fleet(10, |i, j| 100.0 * noise(i, j));
        let why = "node 6 left the fleet at step 11: the connection closed (killed)";
        for r in rows
            .iter_mut()
            .filter(|r| (r.client == 6 || r.server == 6) && r.client.max(r.server) >= 7 && r.client.min(r.server) >= 3)
        {
            (r.gbps, r.p50_us, r.error, r.left) = (None, None, Some(why.into()), Some(6));
        }
        let a = judge(10, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [6], "{:#?}", a.nodes[6]);
        assert!(a.bad_links().is_empty(), "its pairs' failures are its own: {:?}", a.bad_links());
        assert!(
            a.nodes[6].reasons.iter().any(|r| r.to_string() == why),
            "named for leaving, with when: {:?}",
            a.nodes[6]
        );
        let partners_failed: Vec<u32> = a.nodes.iter().map(|n| n.failed_partners).collect();
        assert!(partners_failed.iter().enumerate().all(|(i, &f)| i == 6 || f == 0), "{partners_failed:?}");
    }

    #[test]
    fn a_retest_whose_partner_left_is_inconclusive_never_a_confirmation() {
        // Node 2 is slow (0.5x); its retest against node 5 failed because node 5 left.
        let mut rows = fleet(6, |i, j| 100.0 * noise(i, j) * if i == 2 || j == 2 { 0.5 } else { 1.0 });
        let why = "node 5 left the fleet at step 10: the connection closed";
        rows.push(Observation {
            client: 2,
            server: 5,
            gbps: None,
            p50_us: None,
            error: Some(why.into()),
            left: Some(5),
            retest: Some(Retest::Node { node: 2 }),
        });
        let a = judge(6, &rows, &Thresholds::default());
        let text = a.nodes[2].reasons.last().unwrap().to_string();
        assert!(text.starts_with("inconclusive: retest 2 -> 5"), "{text}");
        assert!(a.nodes[2].bad, "keeps the verdict of its planned pairs");
        assert!(a.nodes[5].bad && a.nodes[5].reasons.iter().any(|r| r.to_string() == why), "{:?}", a.nodes[5]);
        // A slow link's retest cut by its end leaving: inconclusive, and the node that
        // left is named, not the link.
        let mut rows = fleet(6, |i, j| 100.0 * noise(i, j) * if (i.min(j), i.max(j)) == (1, 4) { 0.4 } else { 1.0 });
        rows.push(Observation {
            client: 1,
            server: 4,
            gbps: None,
            p50_us: None,
            error: Some("node 4 left the fleet at step 10: killed".into()),
            left: Some(4),
            retest: Some(Retest::Link { a: 1, b: 4 }),
        });
        let a = judge(6, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [4]);
        assert!(a.bad_links().is_empty(), "{:?}", a.bad_links());
    }
}
