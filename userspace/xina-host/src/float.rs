//! Float collectives over an integer switch.
//!
//! The switch adds integers, so `f32` buffers travel as int32 on jobs of
//! element type int32.
//!
//! # Sum: fixed point with an agreed scale
//!
//! `SwitchML`'s idea: before the data, the ranks agree on a scale through the
//! switch. Each rank sends a histogram of 256 int32s with a 1 in the bin of the
//! largest biased exponent among its inputs (bin 255 if an input is NaN or
//! infinite); the switch sums the histograms, so every rank learns the largest
//! exponent `E` of any input on any rank and whether any input was not finite
//! (then every rank fails alike with [`Error::NonFinite`]). The histogram is
//! one to four packets sent together: one round trip. In the reduce modes it
//! goes to the switch once per rank ([`Collective::Share`]), since only a
//! chunk's root gets its payload there.
//!
//! Every input is below `2^m` in magnitude, `m = E − 126`. With `h` bits of
//! headroom (by default `c = ⌈log₂ n⌉` for `n` ranks) the scale is
//! `s = 30 − m − h`: each input `x` travels as `q = round(x · 2^s)`, and the
//! result is `Σq / 2^s` rounded to `f32`.
//!
//! **Error bound.** With the default headroom no sum can overflow
//! (`n · 2^(m+s) ≤ 2^30`), and every result element is the `f32` nearest to a
//! value within `n · 2^(m+h−31)` of the exact sum of the inputs (each of the
//! `n` roundings to the fixed-point grid is off by at most half a step,
//! `2^−(s+1)`). [`sum_error_bound`] computes it. For 8 ranks and inputs
//! below 1 that is `2^−25` ≈ 3·10⁻⁸.
//!
//! **Overflow.** A smaller headroom ([`Config::float_headroom_bits`]) buys
//! precision when the ranks' values do not all add up in the same direction,
//! at the risk of overflow. The switch flags an overflowed chunk on every rank
//! (results and notices alike), so every rank knows which chunks to redo: the
//! plan sends their elements again at the safe scale (headroom `c`, which
//! cannot overflow) and reports how many chunks it redid in
//! [`Stats::rescaled`]. No overflowed value is ever returned.
//!
//! # Max and min: exact
//!
//! An `f32`'s bits, read as an int32 and with the 31 low bits flipped when the
//! sign is set, order like the floats themselves (−∞ < … < −0 < +0 < … < +∞),
//! so the switch's int32 max and min of those keys are the floats' max and
//! min, bit for bit. A NaN with the sign clear orders above +∞ (a max returns
//! it, a min ignores it), one with the sign set below −∞.

use std::ops::Range;

use xina_proto::Op;

use crate::call::{Plan, Step, StepData, StepOutcome};
use crate::engine::{Collective, Config, Member, Stats};
use crate::error::Error;

/// Bins of the exponent histogram: one per biased exponent of an `f32`.
const BINS: usize = 256;

/// The bin of a NaN or an infinity.
const NON_FINITE: usize = 255;

/// The headroom that makes a sum over `fan_in` ranks unable to overflow:
/// `⌈log₂ fan_in⌉` bits.
pub const fn safe_headroom(fan_in: u8) -> u8 {
    if fan_in <= 1 {
        0
    } else {
        // At most 6 for 64 ranks.
        (u8::BITS - (fan_in - 1).leading_zeros()) as u8
    }
}

/// The fixed-point scale `s` of a sum whose inputs are all below `2^m` in
/// magnitude, `m = biased_exponent − 126`, with `headroom` bits.
pub const fn scale(biased_exponent: u8, headroom: u8) -> i32 {
    30 - (biased_exponent as i32 - 126) - headroom as i32
}

/// The bound on `|result − exact sum|` of a float sum over `fan_in` ranks
/// whose inputs are all at most `max_abs` in magnitude, with the default
/// headroom, before the final rounding to `f32` (see the
/// [module docs](self)).
pub fn sum_error_bound(max_abs: f32, fan_in: u8) -> f64 {
    let s = scale(biased_exponent(max_abs), safe_headroom(fan_in));
    f64::from(fan_in) * 2f64.powi(-s - 1)
}

/// The biased exponent field of an `f32` (255 for NaN and infinities).
const fn biased_exponent(x: f32) -> u8 {
    ((x.to_bits() >> 23) & 0xff) as u8
}

fn quantize(x: f32, s: i32) -> i32 {
    // In range by the choice of `s`; `as` saturates if not.
    (f64::from(x) * 2f64.powi(s)).round() as i32
}

fn dequantize(q: i32, s: i32) -> f32 {
    (f64::from(q) * 2f64.powi(-s)) as f32
}

/// The order-preserving int32 key of an `f32`.
const fn key(x: f32) -> i32 {
    let bits = x.to_bits() as i32;
    if bits < 0 { bits ^ i32::MAX } else { bits }
}

/// The `f32` of a [`key`].
const fn unkey(k: i32) -> f32 {
    f32::from_bits((if k < 0 { k ^ i32::MAX } else { k }) as u32)
}

/// The part of the buffer that holds this rank's result after `collective`.
fn result_region(member: &Member, collective: Collective, len: usize) -> Range<usize> {
    match collective {
        Collective::Allreduce | Collective::Share => 0..len,
        Collective::Reduce { root } if root == member.rank => 0..len,
        Collective::ReduceScatter => {
            let part = len / usize::from(member.fan_in).max(1);
            let start = usize::from(member.rank) * part;
            start..start + part
        }
        Collective::Reduce { .. } | Collective::Barrier => 0..0,
    }
}

#[derive(Debug)]
enum State {
    /// Max or min: the keys are being combined.
    Keys,
    /// Sum: the exponent histogram is being combined.
    Histogram,
    /// Sum: the fixed-point data at scale `s` is being combined.
    Data {
        s: i32,
        safe: i32,
    },
    /// Sum: the overflowed ranges are being redone at the safe scale.
    Redo {
        safe: i32,
        ranges: Vec<Range<usize>>,
    },
    Done,
}

/// The plan of one float call (see the [module docs](self)).
#[derive(Debug)]
pub struct FloatPlan<'a> {
    member: Member,
    collective: Collective,
    headroom: Option<u8>,
    data: &'a mut [f32],
    /// The integer buffer of the current step.
    ints: Vec<i32>,
    state: State,
    stats: Stats,
    failure: Option<Error>,
}

impl<'a> FloatPlan<'a> {
    /// The plan of `collective` over `data` for `member` (an int32 job).
    pub fn new(
        member: Member,
        config: &Config,
        collective: Collective,
        data: &'a mut [f32],
    ) -> Self {
        let (state, ints) = if member.op == Op::Sum {
            let local = data
                .iter()
                .map(|&x| {
                    if x.is_finite() {
                        usize::from(biased_exponent(x))
                    } else {
                        NON_FINITE
                    }
                })
                .max()
                .unwrap_or(0);
            let mut histogram = vec![0; BINS];
            histogram[local] = 1;
            (State::Histogram, histogram)
        } else {
            (State::Keys, data.iter().map(|&x| key(x)).collect())
        };
        Self {
            member,
            collective,
            headroom: config.float_headroom_bits,
            data,
            ints,
            state,
            stats: Stats::default(),
            failure: None,
        }
    }

    fn region(&self) -> Range<usize> {
        result_region(&self.member, self.collective, self.data.len())
    }

    /// Moves on after a successful step.
    fn advance(&mut self, outcome: StepOutcome) {
        self.stats.absorb(&outcome.stats);
        let region = self.region();
        match std::mem::replace(&mut self.state, State::Done) {
            State::Keys => {
                for i in region {
                    self.data[i] = unkey(self.ints[i]);
                }
            }
            State::Histogram => {
                if self.ints[NON_FINITE] != 0 {
                    self.failure = Some(Error::NonFinite {
                        job: self.member.job,
                        rank: self.member.rank,
                    });
                    return;
                }
                let top = self.ints.iter().rposition(|&n| n != 0).unwrap_or(0);
                let top = u8::try_from(top).expect("256 bins");
                let safe = scale(top, safe_headroom(self.member.fan_in));
                let s = self.headroom.map_or(safe, |h| scale(top, h));
                self.ints = self.data.iter().map(|&x| quantize(x, s)).collect();
                self.state = State::Data { s, safe };
            }
            State::Data { s, safe } => {
                let mut ranges = outcome.overflowed;
                ranges.sort_by_key(|r| r.start);
                ranges.dedup();
                if ranges.is_empty() {
                    for i in region {
                        self.data[i] = dequantize(self.ints[i], s);
                    }
                    return;
                }
                self.stats.rescaled += ranges.len() as u64;
                log::debug!(
                    "job {}, rank {}: {} chunk(s) overflowed at scale 2^{s}, redone at 2^{safe}",
                    self.member.job,
                    self.member.rank,
                    ranges.len()
                );
                // Results of the chunks that did not overflow.
                for i in region {
                    if !ranges.iter().any(|r| r.contains(&i)) {
                        self.data[i] = dequantize(self.ints[i], s);
                    }
                }
                self.ints = ranges
                    .iter()
                    .flat_map(|r| self.data[r.clone()].iter().map(|&x| quantize(x, safe)))
                    .collect();
                self.state = State::Redo { safe, ranges };
            }
            State::Redo { safe, ranges } => {
                let mut at = 0;
                for r in ranges {
                    for i in r {
                        if region.contains(&i) {
                            self.data[i] = dequantize(self.ints[at], safe);
                        }
                        at += 1;
                    }
                }
            }
            State::Done => {}
        }
    }
}

impl Plan for FloatPlan<'_> {
    fn next(&mut self) -> Option<Step<'_>> {
        if self.failure.is_some() {
            return None;
        }
        let (collective, tolerate_overflow) = match self.state {
            State::Keys => (self.collective, false),
            // The safe scale of a redo cannot overflow; if it did, fail.
            State::Histogram | State::Redo { .. } => (Collective::Share, false),
            State::Data { .. } => (self.collective, true),
            State::Done => return None,
        };
        Some(Step {
            collective,
            data: StepData::I32(&mut self.ints),
            tolerate_overflow,
        })
    }

    fn feed(&mut self, outcome: Result<StepOutcome, Error>) {
        match outcome {
            Ok(outcome) => self.advance(outcome),
            Err(error) => self.failure = Some(error),
        }
    }

    fn finish(self: Box<Self>) -> Result<Stats, Error> {
        match self.failure {
            Some(error) => Err(error),
            None => Ok(self.stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_like_the_floats() {
        let mut floats = [
            f32::NEG_INFINITY,
            -3.0e38,
            -1.0,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            1.0,
            2.5,
            3.0e38,
            f32::INFINITY,
        ];
        let keys: Vec<i32> = floats.iter().map(|&x| key(x)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        for x in &mut floats {
            assert_eq!(unkey(key(*x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn the_safe_scale_cannot_overflow_and_meets_the_bound() {
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 64].map(safe_headroom),
            [0, 1, 2, 2, 3, 3, 4, 6]
        );
        for (max_abs, fan_in) in [(1.0f32, 8u8), (0.75, 64), (3.0e38, 64), (1e-30, 2)] {
            let s = scale(biased_exponent(max_abs), safe_headroom(fan_in));
            let q = i64::from(quantize(max_abs, s)) * i64::from(fan_in);
            assert!(q.abs() <= 1 << 30, "{max_abs} x {fan_in}: {q}");
            assert!(quantize(max_abs, s) > 1 << 20, "the scale keeps precision");
        }
        assert_eq!(sum_error_bound(0.99, 8), 8.0 * 2f64.powi(-31 + 3));
    }
}
