//! What a run reports: the document `quotient what-if -o json` prints (`{"runs": [...]}`);
//! the CLI renders the same figures as tables.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One replay of a trace on a design with a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// `quotient`, `naive-victims` or `static`.
    pub policy: String,
    /// Which design it ran on: the shares file's name (for `--compare`).
    pub design: String,
    /// Who borrowed first when idle GPUs were too few: `fifo` or `fair`.
    pub borrow_order: String,
    /// GPUs in the fleet.
    pub gpus: u64,
    pub jobs: u64,
    /// Jobs that ended (all of a trace's jobs, unless some never fit).
    pub completed: u64,
    /// Jobs that never started (their queueing delay counts until the replay's end).
    pub never_started: u64,
    /// The utilisation window: from the first submit to the last.
    pub window_hours: f64,
    /// From the first submit to the last event.
    pub makespan_hours: f64,
    /// GPU-hours held by jobs over GPU-hours in the fleet, within the window.
    pub utilisation: f64,
    /// Hours of the window during which some job waited in a queue.
    pub backlog_hours: f64,
    /// Utilisation over those hours alone.
    pub utilisation_under_backlog: f64,
    /// GPU-hours held by jobs over the whole replay, work lost included.
    pub used_gpu_hours: f64,
    /// GPU-hours of work lost to preemptions: run past the last checkpoint.
    pub lost_gpu_hours: f64,
    /// The part of `lost_gpu_hours` lost by jobs that never checkpoint: each of their stops
    /// loses the whole attempt. No victim order saves this work without stopping another
    /// job of the same rank instead; checkpoints in the jobs do. (0 in a report written
    /// before it was counted.)
    #[serde(default)]
    pub lost_gpu_hours_uncheckpointed: f64,
    /// The utilisation less the share of it spent on work later lost (`utilisation` x (1 -
    /// lost / used)): what of the fleet did work that stayed done. A victim order that loses
    /// less redoes less, so it can match another's useful utilisation with a lower one.
    pub useful_utilisation: f64,
    /// Checkpoint signals sent.
    pub preemptions: u64,
    /// The same, by kind (`reclaim`, `in-share`).
    pub preemptions_by_kind: BTreeMap<String, u64>,
    /// Jobs preempted more than 3 times: preemption loops.
    pub jobs_preempted_over_3: u64,
    /// How long lenders waited for their GPUs back.
    pub reclaims: ReclaimStats,
    /// Scheduling rounds that changed the state.
    pub rounds: u64,
    pub shares: BTreeMap<String, ShareReport>,
}

/// From the round that preempts borrowers for a lender's job to that job's start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReclaimStats {
    /// Jobs that reclaimed lent GPUs.
    pub count: u64,
    pub latency_s_p50: f64,
    pub latency_s_p95: f64,
    pub latency_s_max: f64,
    /// The same in scheduling rounds.
    pub rounds_p50: u64,
    pub rounds_p95: u64,
    pub rounds_max: u64,
}

/// One share's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShareReport {
    pub jobs: u64,
    pub completed: u64,
    /// From submit to first start.
    pub queue_delay_s_p50: f64,
    pub queue_delay_s_p95: f64,
    /// The longest any of its jobs waited: a share starved of borrowing shows here.
    pub queue_delay_s_max: f64,
    /// GPU-hours on its own quota, borrowed beyond it, and of its idle quota lent to others
    /// (the state machine's own accounting, as `quotient share usage` reports it).
    pub own_gpu_hours: f64,
    pub borrowed_gpu_hours: f64,
    pub lent_gpu_hours: f64,
    /// Checkpoint signals its jobs got, and the work they lost.
    pub preemptions: u64,
    pub lost_gpu_hours: f64,
    /// Starved of borrowing: the longest span, and the hours in all, during which its queue's
    /// head waited for capacity to borrow (`NoBorrowableCapacity`) while other shares were
    /// given borrowed GPUs. Waiting while nobody borrows is not starving: there was nothing
    /// to give.
    pub borrow_starved_s_max: f64,
    pub borrow_starved_hours: f64,
}

/// The whole document `quotient what-if -o json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub runs: Vec<RunReport>,
}

/// The `p`th percentile of sorted values (nearest rank); 0 for none.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), 50);
        assert_eq!(percentile(&values, 95.0), 95);
        assert_eq!(percentile(&values, 100.0), 100);
        assert_eq!(percentile(&[7], 95.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
