//! The benchmark texts, the same in every driver of the peer comparison (Rust, Python, Node):
//! 30 words picked by the LCG `seed = (seed × 1103515245 + 12345) mod 2³¹` (word
//! `seed × 19 >> 31`), then ` msg{i}`, and the needle in message N/2.

const WORDS: [&str; 19] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau",
];

/// The word only message N/2 holds.
pub const NEEDLE: &str = "needletoken";

pub struct Texts {
    /// The LCG state (42 for the comparison's conversation).
    pub seed: u64,
    /// Messages in the conversation: the needle goes into message `n / 2`.
    pub n: usize,
}

impl Texts {
    /// The generator for a conversation of `n` messages.
    pub fn new(n: usize) -> Self {
        Self { seed: 42, n }
    }

    /// The text of message `i` (call for 0, 1, 2, … in order).
    pub fn next(&mut self, i: usize) -> String {
        let mut words: Vec<&str> = (0..30)
            .map(|_| {
                self.seed = (self.seed * 1_103_515_245 + 12_345) % (1 << 31);
                WORDS[((self.seed * WORDS.len() as u64) >> 31) as usize]
            })
            .collect();
        let tag = format!("msg{i}");
        words.push(&tag);
        if i == self.n / 2 {
            words.push(NEEDLE);
        }
        words.join(" ")
    }
}
