//! A small seeded random number generator (splitmix64): the same seed gives the same
//! numbers on every machine, which is what makes an episode's schedule replayable.

/// splitmix64's output for one state: a well-spread 64-bit value of `x` (the first number of
/// [`quotient_common::rng::Rng`] seeded `x`).
pub fn mix(x: u64) -> u64 {
    quotient_common::rng::Rng::new(x).next_u64()
}

/// The seed of episode `episode` of a run seeded `seed`.
pub fn episode_seed(seed: u64, episode: u32) -> u64 {
    mix(seed ^ mix(u64::from(episode)))
}

/// The simulators' splitmix64 ([`quotient_common::rng::Rng`]), seeded one step on (the state
/// it starts from has had splitmix64's increment added once more), which is how the chaos
/// runs have always drawn: a seed in a replay command or a note gives the schedule it gave.
#[derive(Debug, Clone)]
pub struct Rng(quotient_common::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(quotient_common::rng::Rng::new(
            seed.wrapping_add(quotient_common::rng::GOLDEN_GAMMA),
        ))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.range(0, n - 1)
        }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.unit() <= p
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        self.0.pick(items)
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

    #[test]
    fn a_seed_draws_what_it_drew_before_the_generator_was_shared() {
        // Values of the chaos module's own splitmix64, before it used the simulators'.
        let mut rng = Rng::new(7);
        let drawn: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            drawn,
            [
                0x044c_3cd7_f43c_661c,
                0xe698_4080_bab1_2a02,
                0x953a_eb70_673e_29cb
            ]
        );
        let mut rng = Rng::new(20_240_613);
        assert_eq!(rng.fork(1).next_u64(), 0xf66c_0eee_bcc4_7247);
        assert_eq!(rng.next_u64(), 0x7fe4_4036_d579_1514);
        assert_eq!(episode_seed(20_240_613, 2), 0xaebe_acd8_a1fc_0df3);
    }
}
