//! A small seeded random number generator (splitmix64): the same seed gives the same
//! numbers on every machine, which is what makes an episode's schedule replayable.

/// splitmix64's mixing step: a well-spread 64-bit value of `x`.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of episode `episode` of a run seeded `seed`.
pub fn episode_seed(seed: u64, episode: u32) -> u64 {
    mix(seed ^ mix(u64::from(episode)))
}

/// A splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An independent generator for a part of the episode (a client, the nemesis).
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng::new(mix(self.next_u64() ^ salt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers_and_episodes_differ() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut rng = Rng::new(7);
                move |_| rng.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut rng = Rng::new(7);
                move |_| rng.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(episode_seed(7, 1), episode_seed(7, 2));
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| rng.below(3) < 3));
    }
}
