//! A fleet's rows as a whole: indexed once by pair (an N x N table, so a thousand nodes
//! cost what their million rows cost), completed with a failed row for every planned
//! pair no row reports, and judged. The coordinator (node 0) and `summarize` both go
//! from rows to a verdict through here.

use std::collections::HashSet;

use super::attribution::{self, Attribution, Observation, Thresholds};
use super::schedule::Pair;
use crate::report::pairs::{LeftRow, PairError, PairRow, Retest, RowSource, ServedRow};

/// An index of `n` nodes' ordered pairs: which item (row, observation) each pair's is.
#[derive(Debug, Clone)]
pub struct PairTable {
    n: usize,
    cell: Vec<u32>,
}

const EMPTY: u32 = u32::MAX;

impl PairTable {
    pub fn new(nodes: u32) -> PairTable {
        let n = nodes as usize;
        PairTable { n, cell: vec![EMPTY; n * n] }
    }

    /// The planned (not retest) rows of `rows`, by pair; the first of two rows for one
    /// pair is kept.
    pub fn planned(nodes: u32, rows: &[PairRow]) -> PairTable {
        let mut t = PairTable::new(nodes);
        for (i, r) in rows.iter().enumerate().filter(|(_, r)| !r.is_retest()) {
            t.insert_first(r.client, r.server, i);
        }
        t
    }

    fn at(&self, client: u32, server: u32) -> Option<usize> {
        let (c, s) = (client as usize, server as usize);
        (c < self.n && s < self.n).then_some(c * self.n + s)
    }

    /// Records `item` for `client -> server` unless the pair has one already.
    pub fn insert_first(&mut self, client: u32, server: u32, item: usize) {
        if let Some(at) = self.at(client, server)
            && self.cell[at] == EMPTY
        {
            self.cell[at] = item as u32;
        }
    }

    pub fn get(&self, client: u32, server: u32) -> Option<usize> {
        self.at(client, server).map(|at| self.cell[at]).filter(|&i| i != EMPTY).map(|i| i as usize)
    }
}

/// One planned pair: its step and round, and whether it is a retest (and of what).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub step: u32,
    pub round: u32,
    pub retest: Option<Retest>,
    pub pair: Pair,
}

/// A healthy planned pair's row as node 0 keeps it: the figures its verdict weighs, the
/// measuring node having printed the whole row. Half a million (a thousand nodes) take
/// 32 MB, where whole rows took ten times that.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub step: u32,
    pub client: u32,
    pub server: u32,
    pub gbps: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

impl Figures {
    /// `r`'s figures when they are all node 0 needs of it: a planned pair its client
    /// measured without an error on either side.
    pub fn of(r: &PairRow) -> Option<Figures> {
        (r.ok() && r.peer_error.is_none() && !r.is_retest() && r.source == RowSource::Client).then_some(Figures {
            step: r.step,
            client: r.client,
            server: r.server,
            gbps: r.gbps,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
        })
    }

    pub fn observation(&self) -> Observation {
        Observation {
            client: self.client,
            server: self.server,
            gbps: self.gbps,
            p50_us: self.p50_us,
            error: None,
            left: None,
            retest: None,
        }
    }
}

/// A row's key for [`missing`]: its pair, and whether it is a retest.
pub fn key(r: &PairRow) -> (u32, u32, bool) {
    (r.client, r.server, r.is_retest())
}

/// A failed row, written by the coordinator, for every `expected` pair that no row of
/// `present` reports (a planned pair by any planned row of it, a retest by a retest: the
/// step numbers depend on the fleet's cap, which its logs do not say; each given by its
/// [`key`]); `why` says why it is missing.
pub fn missing(
    present: impl IntoIterator<Item = (u32, u32, bool)>,
    expected: &[Expected],
    why: impl Fn(&Expected) -> PairError,
) -> Vec<PairRow> {
    let have: HashSet<(u32, u32, bool)> = present.into_iter().collect();
    expected
        .iter()
        .filter(|e| !have.contains(&(e.pair.client, e.pair.server, e.retest.is_some())))
        .map(|e| {
            let mut r = PairRow::failed(e.step, e.round, e.retest, e.pair.client, e.pair.server, why(e));
            r.source = RowSource::Coordinator;
            r
        })
        .collect()
}

/// Where a node printed its own row and the coordinator, which did not receive it (the
/// node died before its next arrival), printed a failed one: the node's own is the pair's.
/// Returns how many coordinator rows gave way.
pub fn prefer_measured(rows: &mut Vec<PairRow>) -> usize {
    let measured: HashSet<(u32, u32, u32)> =
        rows.iter().filter(|r| r.source == RowSource::Client).map(|r| (r.step, r.client, r.server)).collect();
    let before = rows.len();
    rows.retain(|r| r.source == RowSource::Client || !measured.contains(&(r.step, r.client, r.server)));
    before - rows.len()
}

/// Each server's record of a pair joined to the pair's row (by step and pair): the
/// server's counters and its own error, so a failed pair is seen from both ends. Node 0
/// joins what its nodes sent, `summarize` what their logs hold.
pub fn join_served(rows: &mut [PairRow], served: impl IntoIterator<Item = ServedRow>) {
    let mut by_pair: std::collections::HashMap<_, _> =
        served.into_iter().map(|s| ((s.step, s.client, s.server), s)).collect();
    for r in rows.iter_mut().filter(|r| r.source == RowSource::Client) {
        if let Some(s) = by_pair.remove(&(r.step, r.client, r.server)) {
            (r.peer_counters, r.peer_error) = (s.counters, s.error);
        }
    }
}

/// A row as the verdict's arithmetic sees it.
pub fn observation(r: &PairRow) -> Observation {
    Observation {
        client: r.client,
        server: r.server,
        gbps: r.gbps,
        p50_us: r.p50_us,
        error: r.error.as_ref().map(|e| e.to_string()),
        left: r.error.as_ref().and_then(|e| e.node),
        retest: r.retest,
    }
}

/// The fleet's verdict from its rows: the one path from rows to a verdict.
pub fn judge(nodes: u32, rows: &[PairRow], t: &Thresholds) -> Attribution {
    let observations: Vec<Observation> = rows.iter().map(observation).collect();
    attribution::judge(nodes, &observations, t)
}

/// The verdict from the rows and the nodes that left the fleet (the barrier's record:
/// node 0's own, or its `RDMABENCH_LEFT` lines): each is bad for leaving, even one that
/// left after its last pair.
pub fn judge_with_departures(nodes: u32, rows: &[PairRow], left: &[LeftRow], t: &Thresholds) -> Attribution {
    judge_observations(nodes, rows.iter().map(observation).collect(), left, t)
}

/// [`judge_with_departures`] on observations (node 0's, from whole rows and figures).
pub fn judge_observations(nodes: u32, observations: Vec<Observation>, left: &[LeftRow], t: &Thresholds) -> Attribution {
    let mut a = attribution::judge_owned(nodes, observations, t);
    for l in left {
        a.mark_left(l.node, &l.why);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::pairs::Phase;

    fn ok_row(step: u32, client: u32, server: u32) -> PairRow {
        let mut r = PairRow::blank(step, 0, None, client, server);
        r.gbps = Some(1.0);
        r
    }

    #[test]
    fn the_table_finds_each_planned_pair_and_keeps_the_first() {
        let mut rows = vec![ok_row(0, 0, 1), ok_row(1, 1, 0), ok_row(2, 2, 1)];
        let mut retest = ok_row(9, 0, 1);
        retest.retest = Some(Retest::Link { a: 0, b: 1 });
        rows.push(retest);
        rows.push(ok_row(5, 0, 1));
        let t = PairTable::planned(3, &rows);
        assert_eq!((t.get(0, 1), t.get(1, 0), t.get(2, 1), t.get(1, 2)), (Some(0), Some(1), Some(2), None));
        assert_eq!(t.get(7, 1), None, "outside the fleet");
    }

    #[test]
    fn missing_pairs_become_coordinator_rows_and_a_nodes_own_row_wins() {
        let expected = [
            Expected { step: 3, round: 1, retest: None, pair: Pair { client: 0, server: 1 } },
            Expected { step: 3, round: 1, retest: None, pair: Pair { client: 2, server: 3 } },
        ];
        let mut retest = ok_row(3, 2, 3);
        retest.retest = Some(Retest::Node { node: 2 });
        let present = [ok_row(7, 0, 1), retest];
        let filled = missing(present.iter().map(key), &expected, |e| {
            PairError::node_left(e.pair.client, format!("node {} left", e.pair.client))
        });
        assert_eq!(filled.len(), 1);
        assert_eq!((filled[0].step, filled[0].client, filled[0].source), (3, 2, RowSource::Coordinator));
        assert_eq!(filled[0].error.as_ref().unwrap().to_string(), "node 2 left");
        let mut all = vec![ok_row(3, 2, 3)];
        all[0].error = Some(PairError::of(&crate::Error::Peer("x".into()), Some(Phase::Bandwidth)));
        all.extend(filled);
        assert_eq!(prefer_measured(&mut all), 1);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].source, RowSource::Client);
    }

    #[test]
    fn a_servers_record_joins_its_pairs_row_only() {
        let mut rows = vec![ok_row(4, 0, 1), ok_row(4, 2, 3), PairRow::blank(6, 0, None, 1, 0)];
        rows[2].source = RowSource::Coordinator;
        let served = |step, client, server, error: Option<&str>| ServedRow {
            step,
            client,
            server,
            counters: [("duplicate_request".to_string(), 9)].into(),
            error: error.map(str::to_string),
        };
        join_served(
            &mut rows,
            [served(4, 0, 1, Some("waited for send completions")), served(5, 2, 3, None), served(6, 1, 0, None)],
        );
        assert_eq!(rows[0].peer_error.as_deref(), Some("waited for send completions"));
        assert_eq!(rows[0].peer_counters["duplicate_request"], 9);
        assert!(rows[1].peer_counters.is_empty(), "another step's record is another pair's");
        assert!(rows[2].peer_counters.is_empty(), "a coordinator's row has no server that saw it");
    }
}
