//! Which node or link of an all-pairs fleet is bad, from every pair's figures.
//!
//! Bandwidth: log(bw_ij) = mu + node_i + node_j + residual_ij, fitted by a median polish
//! for this symmetric model (each node's effect moves by the median of its residuals
//! until nothing moves), so a few bad pairs cannot drag the fit. A node is bad when its
//! effect, as a ratio to the typical node, is below `node_min_ratio`, when its robust
//! z-score (against the median and MAD of all effects) is below `node_min_z`, or when it
//! failed against at least `fail_share` of its partners. A link is bad when its residual,
//! as a ratio, is below `link_min_ratio` (or the pair failed) and neither end is bad.
//! Latency: a pair is slow when its p50 is above `latency_max_ratio` times the fleet's
//! best pair (ClusterKit's 2.1x); a node is slow when the median of its pairs is, a link
//! when it is and neither end is. Pure arithmetic on plain rows; tests give it matrices.

use serde::{Deserialize, Serialize};

/// The thresholds of the verdict (workload keys `[fleet]`, these defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    pub node_min_ratio: f64,
    pub node_min_z: f64,
    pub link_min_ratio: f64,
    pub fail_share: f64,
    pub latency_max_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            node_min_ratio: 0.93,
            node_min_z: -3.5,
            link_min_ratio: 0.93,
            fail_share: 0.5,
            latency_max_ratio: 2.1,
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
        if !(self.node_min_z.is_finite() && self.node_min_z < 0.0) {
            return Err(format!("node_min_z = {}: use a negative z-score, like -3.5", self.node_min_z));
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
    /// A retest after the planned rounds (`judge` weighs it; the fit leaves it out).
    pub retest: bool,
}

/// The smallest spread of node effects (log units) a z-score divides by: a fleet whose
/// nodes agree to within measurement noise would otherwise call a 0.5 % difference bad.
pub const MIN_SPREAD: f64 = 0.005;

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
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkVerdict {
    pub a: u32,
    pub b: u32,
    /// exp(residual): the link's bandwidth against what its two nodes predict.
    pub ratio: Option<f64>,
    pub gbps: Option<f64>,
    pub p50_us: Option<f64>,
    pub bad: bool,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    /// exp(mu): the typical pair's bandwidth, Gb/s.
    pub typical_gbps: Option<f64>,
    /// The fleet's best pair p50, us.
    pub best_p50_us: Option<f64>,
    pub nodes: Vec<NodeVerdict>,
    /// Every link measured (both directions folded), bad or not.
    pub links: Vec<LinkVerdict>,
}

impl Attribution {
    pub fn bad_nodes(&self) -> Vec<u32> {
        self.nodes.iter().filter(|n| n.bad).map(|n| n.node).collect()
    }

    pub fn bad_links(&self) -> Vec<(u32, u32)> {
        self.links.iter().filter(|l| l.bad).map(|l| (l.a, l.b)).collect()
    }
}

pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// The fit: mu and each node's effect (None: no working pair).
fn polish(n: usize, obs: &[(usize, usize, f64)]) -> (f64, Vec<Option<f64>>) {
    let mut mu = median(&mut obs.iter().map(|o| o.2).collect::<Vec<_>>()).unwrap_or(0.0);
    let mut e = vec![0.0; n];
    let has: Vec<bool> = (0..n).map(|i| obs.iter().any(|o| o.0 == i || o.1 == i)).collect();
    for _ in 0..100 {
        let mut moved: f64 = 0.0;
        for i in (0..n).filter(|&i| has[i]) {
            let mut r: Vec<f64> =
                obs.iter().filter(|o| o.0 == i || o.1 == i).map(|&(a, b, y)| y - mu - e[a] - e[b]).collect();
            let step = median(&mut r).unwrap_or(0.0);
            e[i] += step;
            moved = moved.max(step.abs());
        }
        // Keep the typical node at 0: a shift c of every effect is 2c of mu.
        let c = median(&mut (0..n).filter(|&i| has[i]).map(|i| e[i]).collect::<Vec<_>>()).unwrap_or(0.0);
        e.iter_mut().for_each(|x| *x -= c);
        mu += 2.0 * c;
        let mut r: Vec<f64> = obs.iter().map(|&(a, b, y)| y - mu - e[a] - e[b]).collect();
        let m = median(&mut r).unwrap_or(0.0);
        mu += m;
        if moved.max(m.abs()) < 1e-9 {
            break;
        }
    }
    (mu, (0..n).map(|i| has[i].then_some(e[i])).collect())
}

/// The final verdict: [`attribute`] on the planned pairs, then each suspect's retests.
/// A suspect node stays bad when its retest against a known-good peer is still below
/// `node_min_ratio` of what that peer's typical pair gives (or still slow), and is cleared
/// when it is not; a suspect link likewise against what its two nodes predict. A suspect
/// without a retest keeps its verdict.
pub fn judge(n: u32, rows: &[Observation], t: &Thresholds) -> Attribution {
    let planned: Vec<Observation> = rows.iter().filter(|r| !r.retest).cloned().collect();
    let mut a = attribute(n, &planned, t);
    let (mu, best) = (a.typical_gbps, a.best_p50_us);
    let effects: Vec<Option<f64>> = a.nodes.iter().map(|x| x.ratio).collect();
    for r in rows.iter().filter(|r| r.retest) {
        let (c, s) = (r.client as usize, r.server as usize);
        if c >= a.nodes.len() || s >= a.nodes.len() {
            continue;
        }
        let node_suspect = a.nodes[c].bad;
        // A node against its known-good peer's typical pair; a link against its two nodes.
        let expected =
            mu.zip(effects[s]).map(|(m, g)| if node_suspect { m * g } else { m * g * effects[c].unwrap_or(1.0) });
        let ratio = r.gbps.zip(expected).map(|(g, e)| g / e);
        let slow = r.p50_us.zip(best).is_some_and(|(p, b)| p > t.latency_max_ratio * b);
        let limit = if node_suspect { t.node_min_ratio } else { t.link_min_ratio };
        let still = r.error.is_some() || ratio.is_some_and(|x| x < limit) || slow;
        let what = match (&r.error, ratio) {
            (Some(e), _) => format!("retest {c} -> {s} failed: {e}"),
            (None, Some(x)) => {
                format!("retest {c} -> {s}: bandwidth {x:.3}x the expected{}", if slow { ", slow" } else { "" })
            }
            (None, None) => format!("retest {c} -> {s}: no bandwidth figure"),
        };
        let said = format!("{}: {what}", if still { "confirmed" } else { "cleared" });
        if node_suspect {
            a.nodes[c].reasons.push(said);
            a.nodes[c].bad = still;
        } else if let Some(l) =
            a.links.iter_mut().find(|l| (l.a as usize, l.b as usize) == (c.min(s), c.max(s)) && l.bad)
        {
            l.reasons.push(said);
            l.bad = still;
        }
    }
    a
}

/// The verdict on `n` nodes from every observation (retests left out).
pub fn attribute(n: u32, rows: &[Observation], t: &Thresholds) -> Attribution {
    let n = n as usize;
    let ok: Vec<&Observation> = rows.iter().filter(|r| r.error.is_none() && !r.retest).collect();
    let obs: Vec<(usize, usize, f64)> = ok
        .iter()
        .filter_map(|r| r.gbps.filter(|g| *g > 0.0).map(|g| (r.client as usize, r.server as usize, g.ln())))
        .collect();
    let (mu, effects) = polish(n, &obs);
    let fitted: Vec<f64> = effects.iter().flatten().copied().collect();
    let centre = median(&mut fitted.clone()).unwrap_or(0.0);
    let mad = median(&mut fitted.iter().map(|e| (e - centre).abs()).collect::<Vec<_>>()).unwrap_or(0.0);
    let spread = (1.4826 * mad).max(MIN_SPREAD);
    let best_p50 = ok.iter().filter_map(|r| r.p50_us).filter(|p| *p > 0.0).min_by(f64::total_cmp);

    let mut nodes: Vec<NodeVerdict> = (0..n)
        .map(|i| {
            let mine: Vec<&Observation> =
                rows.iter().filter(|r| !r.retest && (r.client as usize == i || r.server as usize == i)).collect();
            let partner = |r: &Observation| if r.client as usize == i { r.server } else { r.client };
            let mut partners: Vec<u32> = mine.iter().map(|r| partner(r)).collect();
            partners.sort_unstable();
            partners.dedup();
            let mut failed: Vec<u32> = mine.iter().filter(|r| r.error.is_some()).map(|r| partner(r)).collect();
            failed.sort_unstable();
            failed.dedup();
            let p50 =
                median(&mut mine.iter().filter(|r| r.error.is_none()).filter_map(|r| r.p50_us).collect::<Vec<_>>());
            let ratio = effects[i].map(f64::exp);
            let z = effects[i].map(|e| (e - centre) / spread);
            let mut reasons = Vec::new();
            if let Some(r) = ratio.filter(|r| *r < t.node_min_ratio) {
                reasons.push(format!("bandwidth {r:.3}x the typical node's (below {})", t.node_min_ratio));
            }
            if let Some(z) = z.filter(|z| *z < t.node_min_z) {
                reasons.push(format!("robust z-score {z:.1} (below {})", t.node_min_z));
            }
            if !partners.is_empty() && failed.len() as f64 >= t.fail_share * partners.len() as f64 {
                reasons.push(format!("failed against {} of its {} partners", failed.len(), partners.len()));
            }
            if let (Some(p), Some(best)) = (p50, best_p50)
                && p > t.latency_max_ratio * best
            {
                reasons.push(format!(
                    "latency p50 {p:.1} us, {:.2}x the fleet's best pair (above {})",
                    p / best,
                    t.latency_max_ratio
                ));
            }
            NodeVerdict {
                node: i as u32,
                ratio,
                z,
                partners: partners.len() as u32,
                failed_partners: failed.len() as u32,
                p50_us: p50,
                bad: !reasons.is_empty(),
                reasons,
            }
        })
        .collect();

    let rows: Vec<&Observation> = rows.iter().filter(|r| !r.retest).collect();
    let mut keys: Vec<(u32, u32)> = rows.iter().map(|r| (r.client.min(r.server), r.client.max(r.server))).collect();
    keys.sort_unstable();
    keys.dedup();
    let links = keys
        .into_iter()
        .map(|(a, b)| {
            let both: Vec<&Observation> =
                rows.iter().filter(|r| (r.client.min(r.server), r.client.max(r.server)) == (a, b)).copied().collect();
            let good: Vec<&&Observation> = both.iter().filter(|r| r.error.is_none()).collect();
            let gbps = median(&mut good.iter().filter_map(|r| r.gbps).collect::<Vec<_>>());
            let p50 = median(&mut good.iter().filter_map(|r| r.p50_us).collect::<Vec<_>>());
            let (ea, eb) = (effects[a as usize], effects[b as usize]);
            let ratio = match (gbps.filter(|g| *g > 0.0), ea, eb) {
                (Some(g), Some(ea), Some(eb)) => Some((g.ln() - mu - ea - eb).exp()),
                _ => None,
            };
            let ends_bad = nodes[a as usize].bad || nodes[b as usize].bad;
            let mut reasons = Vec::new();
            for r in both.iter().filter(|r| r.error.is_some()) {
                reasons.push(format!("{} -> {} failed: {}", r.client, r.server, r.error.as_deref().unwrap_or("")));
            }
            if let Some(r) = ratio.filter(|r| *r < t.link_min_ratio) {
                reasons.push(format!("bandwidth {r:.3}x what its two nodes predict (below {})", t.link_min_ratio));
            }
            if let (Some(p), Some(best)) = (p50, best_p50)
                && p > t.latency_max_ratio * best
                && !(nodes[a as usize].p50_us.is_some_and(|x| x > t.latency_max_ratio * best)
                    || nodes[b as usize].p50_us.is_some_and(|x| x > t.latency_max_ratio * best))
            {
                reasons.push(format!("latency p50 {p:.1} us, {:.2}x the fleet's best pair", p / best));
            }
            LinkVerdict { a, b, ratio, gbps, p50_us: p50, bad: !reasons.is_empty() && !ends_bad, reasons }
        })
        .collect();
    nodes.iter_mut().for_each(|n| n.reasons.dedup());
    Attribution { typical_gbps: (!obs.is_empty()).then(|| mu.exp()), best_p50_us: best_p50, nodes, links }
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
                        retest: false,
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
        assert!((n3.ratio.unwrap() - 0.5).abs() < 0.05 && n3.reasons[0].contains("bandwidth"), "{n3:?}");
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
        assert!(a.nodes[2].reasons.iter().any(|r| r.contains("failed against 4 of its 4")), "{:?}", a.nodes[2]);
        assert!(a.bad_links().is_empty(), "the dead node's links are its own: {:?}", a.bad_links());
    }

    #[test]
    fn a_small_dip_in_a_tight_fleet_is_caught_by_the_z_score() {
        let a =
            attribute(8, &fleet(8, |i, j| 100.0 * if i == 5 || j == 5 { 0.95 } else { 1.0 }), &Thresholds::default());
        assert_eq!(a.bad_nodes(), [5]);
        assert!(a.nodes[5].reasons.iter().all(|r| r.contains("z-score")), "0.95x passes the ratio: {:?}", a.nodes[5]);
    }

    #[test]
    fn latency_above_2_1x_the_best_names_the_node_or_the_link() {
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
            retest: true,
        };
        let mut rows = fleet(6, slow);
        rows.push(retest(48.0));
        let a = judge(6, &rows, &Thresholds::default());
        assert_eq!(a.bad_nodes(), [3]);
        assert!(a.nodes[3].reasons.last().unwrap().starts_with("confirmed: retest 3 -> 0"), "{:?}", a.nodes[3]);
        let mut rows = fleet(6, slow);
        rows.push(retest(101.0));
        let a = judge(6, &rows, &Thresholds::default());
        assert!(a.bad_nodes().is_empty(), "did not reproduce: {:?}", a.nodes[3]);
        assert!(a.nodes[3].reasons.last().unwrap().starts_with("cleared"));
    }

    #[test]
    fn thresholds_out_of_range_are_refused() {
        assert!(Thresholds::default().check().is_ok());
        assert!(Thresholds { node_min_ratio: 1.5, ..Default::default() }.check().unwrap_err().contains("(0, 1]"));
        assert!(Thresholds { node_min_z: 2.0, ..Default::default() }.check().is_err());
        assert!(Thresholds { latency_max_ratio: 0.5, ..Default::default() }.check().is_err());
    }
}
