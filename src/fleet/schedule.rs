//! Who measures whom, and when, in an all-pairs fleet: a round-robin tournament by the
//! circle method. N nodes play N-1 rounds when N is even and N when it is odd (one node
//! rests each round); every node is in at most one pair a round, and every pair meets
//! exactly once. `--directions both` plays the tournament a second time with the roles
//! swapped; `--max-pairs-per-round` splits a round into steps of at most that many pairs.
//!
//! Every pod computes the whole plan from the same three numbers, so each knows its
//! partner in every step from its index alone; the barrier only says when a step begins.

use serde::{Deserialize, Serialize};

/// The most nodes one fleet may have: a thousand-node cluster of a power of two, with
/// every node's port above the base port (`-p` + index) and a million rows to judge.
pub const MAX_NODES: u32 = 1024;

/// Which directions of each pair are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Directions {
    /// The lower index measures against the higher (its bandwidth flows that way).
    One,
    /// Both ways: a second tournament with the roles swapped.
    Both,
}

/// What a fleet's schedule is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub nodes: u32,
    pub directions: Directions,
    /// At most this many pairs measure at once (`None`: a whole round).
    pub max_pairs_per_round: Option<u32>,
}

/// One measurement: `client` measures against `server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pair {
    pub client: u32,
    pub server: u32,
}

/// One step of the fleet: pairs that measure at the same time, then a barrier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub index: u32,
    /// 0: the first direction; 1: the swapped one.
    pub pass: u32,
    pub round: u32,
    /// Which part of its round this step is (with `max_pairs_per_round`).
    pub slot: u32,
    pub pairs: Vec<Pair>,
}

impl Step {
    /// What `node` does in this step: `Some((pair, true))` when it measures, `false` when
    /// it serves, `None` when it rests.
    pub fn role_of(&self, node: u32) -> Option<(Pair, bool)> {
        self.pairs.iter().find(|p| p.client == node || p.server == node).map(|p| (*p, p.client == node))
    }
}

impl Plan {
    pub fn check(&self) -> Result<(), String> {
        if !(2..=MAX_NODES).contains(&self.nodes) {
            return Err(format!("--pods {}: an all-pairs fleet needs 2 to {MAX_NODES} nodes", self.nodes));
        }
        if self.max_pairs_per_round == Some(0) {
            return Err("--max-pairs-per-round 0: give at least 1 (or leave it out for whole rounds)".into());
        }
        Ok(())
    }

    /// Rounds of one tournament: N-1 for even N, N for odd N.
    pub fn rounds(&self) -> u32 {
        if self.nodes.is_multiple_of(2) { self.nodes - 1 } else { self.nodes }
    }

    /// How many steps [`Plan::steps`] has, without making them (every node needs the
    /// count; only node 0 the steps, half a million pairs at a thousand nodes).
    pub fn step_count(&self) -> usize {
        let passes = match self.directions {
            Directions::One => 1,
            Directions::Both => 2,
        };
        let per_round = (self.nodes / 2) as usize;
        let per = self.max_pairs_per_round.unwrap_or(u32::MAX).max(1) as usize;
        passes * self.rounds() as usize * per_round.div_ceil(per)
    }

    /// Every step, in order.
    pub fn steps(&self) -> Vec<Step> {
        let passes = match self.directions {
            Directions::One => 1,
            Directions::Both => 2,
        };
        let mut steps = Vec::new();
        for pass in 0..passes {
            for round in 0..self.rounds() {
                let pairs: Vec<Pair> = round_pairs(self.nodes, round)
                    .into_iter()
                    .map(|(a, b)| if pass == 0 { Pair { client: a, server: b } } else { Pair { client: b, server: a } })
                    .collect();
                let per = self.max_pairs_per_round.unwrap_or(u32::MAX).max(1) as usize;
                for (slot, chunk) in pairs.chunks(per).enumerate() {
                    steps.push(Step {
                        index: steps.len() as u32,
                        pass,
                        round,
                        slot: slot as u32,
                        pairs: chunk.to_vec(),
                    });
                }
            }
        }
        steps
    }
}

/// Node `x`'s partner in round `round` of `n` nodes' tournament, `None` when it rests.
/// Nodes 0..k-1 sit on a circle (k = n-1 for even n, n for odd) and node k (a real node
/// for even n, the rest for odd n) in its middle: in round r, x meets (2r - x) mod k, and
/// the one node that would meet itself meets the middle.
pub fn partner(n: u32, round: u32, x: u32) -> Option<u32> {
    let k = if n.is_multiple_of(2) { n - 1 } else { n };
    if x == k {
        return Some(round % k);
    }
    let y = ((2 * (round % k)) % k + k - x % k) % k;
    if y == x { (k < n).then_some(k) } else { Some(y) }
}

/// Round `round`'s pairs as (lower, higher), lowest first.
pub fn round_pairs(n: u32, round: u32) -> Vec<(u32, u32)> {
    (0..n).filter_map(|x| partner(n, round, x).filter(|&y| x < y).map(|y| (x, y))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn plan(nodes: u32, directions: Directions, max: Option<u32>) -> Plan {
        Plan { nodes, directions, max_pairs_per_round: max }
    }

    #[test]
    fn the_step_count_is_the_steps_length() {
        for n in 2..=40 {
            for dirs in [Directions::One, Directions::Both] {
                for max in [None, Some(1), Some(2), Some(3), Some(64)] {
                    let p = plan(n, dirs, max);
                    assert_eq!(p.step_count(), p.steps().len(), "{p:?}");
                }
            }
        }
    }

    #[test]
    fn every_pair_meets_once_per_direction_and_nobody_twice_in_a_step() {
        for n in 2..=12 {
            for dirs in [Directions::One, Directions::Both] {
                for max in [None, Some(1), Some(2)] {
                    let steps = plan(n, dirs, max).steps();
                    let mut seen = BTreeSet::new();
                    for s in &steps {
                        let mut busy = BTreeSet::new();
                        for p in &s.pairs {
                            assert!(p.client != p.server && p.client < n && p.server < n, "{n}: {p:?}");
                            assert!(busy.insert(p.client) && busy.insert(p.server), "{n}: a node twice in {s:?}");
                            assert!(seen.insert((p.client, p.server)), "{n}: {p:?} measured twice");
                        }
                        assert!(max.is_none_or(|m| s.pairs.len() <= m as usize), "{s:?}");
                    }
                    let per_direction = (n * (n - 1) / 2) as usize;
                    let expected = if dirs == Directions::Both { 2 * per_direction } else { per_direction };
                    assert_eq!(seen.len(), expected, "{n} nodes, {dirs:?}");
                    if dirs == Directions::Both {
                        assert!(seen.iter().all(|&(a, b)| seen.contains(&(b, a))), "{n}: both ways");
                    }
                }
            }
        }
    }

    #[test]
    fn rounds_are_n_minus_1_for_even_and_n_for_odd_with_one_node_resting() {
        assert_eq!(plan(6, Directions::One, None).rounds(), 5);
        assert_eq!(plan(5, Directions::One, None).rounds(), 5);
        for r in 0..5 {
            assert_eq!(round_pairs(6, r).len(), 3, "even: everyone plays");
            assert_eq!(round_pairs(5, r).len(), 2, "odd: one rests");
            let resting: Vec<u32> = (0..5).filter(|&x| partner(5, r, x).is_none()).collect();
            assert_eq!(resting, [r], "node {r} rests in round {r}");
        }
        let both = plan(8, Directions::Both, None).steps();
        assert_eq!(both.len(), 14);
        assert_eq!(both[7].pairs[0], Pair { client: both[0].pairs[0].server, server: both[0].pairs[0].client });
    }

    #[test]
    fn partners_agree_from_either_side() {
        for n in 2..=9 {
            for r in 0..plan(n, Directions::One, None).rounds() {
                for x in 0..n {
                    if let Some(y) = partner(n, r, x) {
                        assert_eq!(partner(n, r, y), Some(x), "n {n} round {r}: {x} -> {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_cap_splits_rounds_into_steps_and_roles_follow() {
        let steps = plan(8, Directions::One, Some(2)).steps();
        assert_eq!(steps.len(), 14, "7 rounds of 4 pairs, 2 at a time");
        assert!(steps.iter().enumerate().all(|(i, s)| s.index == i as u32));
        let s = &steps[0];
        let (p, measures) = s.role_of(s.pairs[0].client).unwrap();
        assert!(measures && p == s.pairs[0]);
        assert_eq!(s.role_of(s.pairs[0].server).map(|r| r.1), Some(false));
        assert!(plan(1, Directions::One, None).check().is_err());
        assert!(plan(4, Directions::One, Some(0)).check().unwrap_err().contains("at least 1"));
    }
}
