//! `--step N` in cluster mode without every peer's whole range: one peer's history says when
//! step N ran, then every peer is asked for that stretch only (plus the steps around it that
//! period detection needs). Over 128 hosts × 8 ranks × 1 000 steps that is ~10 steps' calls
//! from each peer instead of 1 000.
//!
//! Step ids make this exact: marker steps carry their id, and period steps count periods of
//! the main communicator's sequence numbers (`pipeline`), so the id does not depend on how
//! much history is looked at. When the step cannot be located (no locator answers, the step
//! is not in its history, or its id is ambiguous) the whole range is fetched as before.

use std::{sync::mpsc, time::Duration};

use super::fetch;
use crate::{
    pipeline::find_steps,
    timeline::{join_calls, Step},
};

/// Peers asked at once to locate the step; the first to answer is used.
const LOCATORS: usize = 3;
/// Steps of the same job fetched before the step (period detection needs at least three
/// periods, and a period step begins where the previous period ended) and after it.
const BEFORE: usize = 4;
const AFTER: usize = 2;
/// Slack on both sides: other hosts' clocks (NTP keeps them within milliseconds) and ranks
/// that begin or end apart.
const SLACK_SECONDS: f64 = 1.0;

/// The stretch of history that holds a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    pub since: f64,
    pub until: f64,
    /// The peer whose history located it.
    pub peer: String,
}

/// Where `step` lies in `[since, until]`, from the first of the first [`LOCATORS`] peers to
/// answer. Peers that are slow or down cost nothing once another answered (their requests
/// run on, detached, until their own timeout).
pub fn locate(peers: &[String], step: u64, since: f64, until: f64, timeout: Duration) -> Option<Located> {
    let (tx, rx) = mpsc::channel();
    let agent = fetch::client();
    for peer in &peers[..peers.len().min(LOCATORS)] {
        let (tx, agent, peer) = (tx.clone(), agent.clone(), peer.clone());
        std::thread::spawn(move || {
            let _ = tx.send(fetch::fetch_peer(&agent, &peer, since, until, timeout));
        });
    }
    drop(tx);
    let p = rx.iter().find_map(Result::ok)?;
    let colls = join_calls(p.calls.iter());
    let (found, _) = find_steps(&p.markers, &colls);
    let mut hits = found.iter().filter(|f| f.step.id == step);
    let (hit, None) = (hits.next()?, hits.next()) else { return None };
    let mut job: Vec<&Step> = found.iter().filter(|f| f.job == hit.job).map(|f| &f.step).collect();
    job.sort_by(|a, b| a.begin.total_cmp(&b.begin));
    let i = job.iter().position(|s| s.id == step)?;
    let lo = job[i.saturating_sub(BEFORE)].begin - SLACK_SECONDS;
    let hi = job.get(i + AFTER).map_or(until, |s| s.end + SLACK_SECONDS);
    Some(Located { since: lo.max(since), until: hi.min(until), peer: p.peer })
}
