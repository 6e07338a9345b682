//! A seeded pseudo-random source for the simulators (`quotient-sim`, `quotient-eval`, the chaos runs):
//! SplitMix64 from one seed, so a seed replays the same history bit for bit. Nothing on a
//! coordinator or agent draws from it.

/// SplitMix64's increment of the state per number drawn (2^64 / the golden ratio).
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A seeded pseudo-random source (SplitMix64: Steele, Lea and Flood, 2014).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A source of its own for one part of the simulation, so that drawing more numbers in
    /// one part does not shift another's.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        let span = high - low;
        if span == u64::MAX {
            return self.next_u64();
        }
        low + self.next_u64() % (span + 1)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.next_u64() % denominator < numerator
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }

    /// A number in `[0, 1)`, from the top 53 bits of one draw.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponentially distributed wait with mean `mean_ms`, at most 20 means.
    pub fn exponential_ms(&mut self, mean_ms: u64) -> u64 {
        let wait = -(1.0 - self.unit()).ln() * mean_ms as f64;
        (wait as u64).min(mean_ms.saturating_mul(20))
    }

    /// A standard normal number (Box-Muller, from two draws).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence() {
        let first: Vec<u64> = (0..8)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let again: Vec<u64> = (0..8)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let other: Vec<u64> = (0..8)
            .scan(Rng::new(8), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(first, again);
        assert_ne!(first, other);
    }

    #[test]
    fn ranges_hold_their_bounds() {
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            let value = rng.range(3, 9);
            assert!((3..=9).contains(&value));
        }
        assert!((0..1_000).all(|_| rng.exponential_ms(10) <= 200));
    }
}
