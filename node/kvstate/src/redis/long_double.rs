//! INCRBYFLOAT's arithmetic, as Redis does it: C's `long double`, which
//! on x86-64 (every Redis build this is compared with) is the x87 80-bit
//! extended format — a 64-bit significand, binary exponents from −16382
//! (subnormals below, down to 2^−16445) to 16383. Parsing is Redis's
//! `string2ld` (glibc `strtold`, correctly rounded, then Redis's checks);
//! the sum is rounded once, to nearest, ties to even; formatting is
//! Redis's `ld2string(.., LD_STR_HUMAN)`: `%.17Lf` (the exact binary value
//! rounded to 17 decimals, ties to even), trailing zeros and a trailing
//! point cut, and `-0` written `0`. Everything is exact integer arithmetic
//! on a small big-integer type: no host floating point, so every replica
//! computes the same bytes.

use std::cmp::Ordering;

/// Bytes of a string Redis parses as a long double at most: its
/// `MAX_LONG_DOUBLE_CHARS` (5 KiB) buffer, NUL included.
pub const LONG_DOUBLE_CHARS_MAX: usize = 5 * 1024 - 1;
/// Bits of the significand.
const PRECISION_BITS: u32 = 64;
/// The exponent `q` of the smallest subnormal, `1 × 2^q` (2^−16445): the
/// value is `m × 2^q` with `m < 2^64`.
const Q_MIN: i64 = -16445;
/// The exponent `q` of the largest finite value, `(2^64 − 1) × 2^q`.
const Q_MAX: i64 = 16320;
/// Decimal digits past which a magnitude certainly overflows (10^4933 >
/// the largest long double, about 1.19 × 10^4932) or underflows to zero
/// (below 10^−4952, under half the smallest subnormal, 3.6 × 10^−4951).
const DECIMAL_EXPONENT_LIMIT: i64 = 5000;
/// Decimal places `%.17Lf` prints.
const FORMAT_DECIMALS: u32 = 17;

/// A finite x87 extended value: `(-1)^negative × significand × 2^exponent`,
/// `significand < 2^64`; zero has significand 0 (and keeps its sign).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongDouble {
    negative: bool,
    significand: u64,
    exponent: i64,
}

/// A parse or a sum that is not a finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotFinite {
    /// ±infinity (parsed `inf`, or an overflow of a sum).
    Infinite,
    /// Not a number.
    NaN,
}

impl LongDouble {
    /// Zero.
    pub const ZERO: LongDouble = LongDouble {
        negative: false,
        significand: 0,
        exponent: 0,
    };

    /// Redis's `string2ld`: `None` when Redis answers "value is not a
    /// valid float" (empty, too long, leading space, trailing bytes, NaN,
    /// or a magnitude `strtold` reports out of range as infinity or zero);
    /// `Some(Err(Infinite))` for a parsed `inf` / `infinity`, which Redis
    /// accepts here and refuses later.
    pub fn parse(bytes: &[u8]) -> Option<Result<LongDouble, NotFinite>> {
        if bytes.is_empty() || bytes.len() > LONG_DOUBLE_CHARS_MAX {
            return None;
        }
        // Redis copies into a C string: strtold stops at a NUL, which then
        // counts as the end.
        let bytes = match bytes.iter().position(|&b| b == 0) {
            Some(end) => &bytes[..end],
            None => bytes,
        };
        if bytes
            .first()
            .is_none_or(|b| b.is_ascii_whitespace() || *b == 0x0b)
        {
            return None;
        }
        let (negative, rest) = match bytes[0] {
            b'-' => (true, &bytes[1..]),
            b'+' => (false, &bytes[1..]),
            _ => (false, bytes),
        };
        let lower: Vec<u8> = rest.iter().map(u8::to_ascii_lowercase).collect();
        if lower == b"inf" || lower == b"infinity" {
            return Some(Err(NotFinite::Infinite));
        }
        if lower.starts_with(b"nan") {
            return None;
        }
        let exact = if lower.len() > 2 && lower.starts_with(b"0x") {
            parse_hex(&lower[2..])?
        } else {
            parse_decimal(&lower)?
        };
        match exact {
            Exact::Zero => Some(Ok(LongDouble {
                negative,
                ..LongDouble::ZERO
            })),
            Exact::Value { big, exponent } => match round(negative, big, exponent, false) {
                // strtold's ERANGE with an infinite or zero result: refused.
                Rounded::Finite(value) if value.significand == 0 => None,
                Rounded::Finite(value) => Some(Ok(value)),
                Rounded::Overflow => None,
            },
            Exact::TooLarge => None,
            Exact::TooSmall => None,
        }
    }

    /// `self + other`, rounded to nearest (ties to even); an overflow is
    /// infinite.
    pub fn plus(self, other: LongDouble) -> Result<LongDouble, NotFinite> {
        if other.significand == 0 {
            return Ok(if self.significand == 0 {
                // IEEE: −0 + −0 = −0, any other sum of zeros is +0.
                LongDouble {
                    negative: self.negative && other.negative,
                    ..LongDouble::ZERO
                }
            } else {
                self
            });
        }
        if self.significand == 0 {
            return Ok(other);
        }
        // Line both up on the lower exponent; a term more than
        // SPREAD_BITS below the other only decides rounding (sticky).
        const SPREAD_BITS: i64 = 2 * PRECISION_BITS as i64 + 4;
        let (high, low) = if self.exponent >= other.exponent {
            (self, other)
        } else {
            (other, self)
        };
        let spread = high.exponent - low.exponent;
        let (big_high, big_low, exponent, sticky) = if spread > SPREAD_BITS {
            // low is below every bit that can round: keep it as one
            // sticky unit under a widened high.
            let big_high = Big::from_u64(high.significand).shl(SPREAD_BITS as u32);
            (
                big_high,
                Big::from_u64(1),
                high.exponent - SPREAD_BITS,
                false,
            )
        } else {
            (
                Big::from_u64(high.significand).shl(spread as u32),
                Big::from_u64(low.significand),
                low.exponent,
                false,
            )
        };
        let (negative, magnitude) = if high.negative == low.negative {
            (high.negative, big_high.add(&big_low))
        } else {
            match big_high.cmp(&big_low) {
                Ordering::Greater => (high.negative, big_high.sub(&big_low)),
                Ordering::Less => (low.negative, big_low.sub(&big_high)),
                // x − x = +0 when rounding to nearest.
                Ordering::Equal => return Ok(LongDouble::ZERO),
            }
        };
        match round(negative, magnitude, exponent, sticky) {
            Rounded::Finite(value) => Ok(value),
            Rounded::Overflow => Err(NotFinite::Infinite),
        }
    }

    /// Redis's `ld2string(.., LD_STR_HUMAN)`: `%.17Lf`, then trailing
    /// zeros and point cut; `-0` is written `0`.
    pub fn format(self) -> String {
        let scale = Big::pow10(FORMAT_DECIMALS);
        // The value × 10^17, rounded to an integer, ties to even.
        let scaled = if self.exponent >= 0 {
            Big::from_u64(self.significand)
                .shl(self.exponent as u32)
                .mul(&scale)
        } else {
            let shift = (-self.exponent) as u32;
            let numerator = Big::from_u64(self.significand).mul(&scale);
            let (quotient, remainder_bits) = numerator.shr_with_rest(shift);
            // Compare the rest with half of 2^shift.
            let round_up = match remainder_bits {
                Rest::Zero => false,
                Rest::BelowHalf => false,
                Rest::AboveHalf => true,
                Rest::Half => quotient.is_odd(),
            };
            if round_up {
                quotient.add(&Big::from_u64(1))
            } else {
                quotient
            }
        };
        let mut digits = scaled.to_decimal();
        while digits.len() <= FORMAT_DECIMALS as usize {
            digits.insert(0, '0');
        }
        let point = digits.len() - FORMAT_DECIMALS as usize;
        let mut text = format!("{}.{}", &digits[..point], &digits[point..]);
        while text.ends_with('0') {
            text.pop();
        }
        if text.ends_with('.') {
            text.pop();
        }
        if self.negative && text != "0" {
            text.insert(0, '-');
        }
        text
    }
}

/// An exact parsed magnitude: `big × 2^exponent`, before rounding.
enum Exact {
    Zero,
    Value { big: Big, exponent: i64 },
    TooLarge,
    TooSmall,
}

/// `strtold`'s decimal syntax, whole: digits, an optional point and
/// digits (at least one digit in all), an optional `e` exponent.
fn parse_decimal(text: &[u8]) -> Option<Exact> {
    let mut position = 0;
    let mut digits: Vec<u8> = Vec::new();
    let mut fraction_digits: i64 = 0;
    let mut seen_digit = false;
    while position < text.len() && text[position].is_ascii_digit() {
        digits.push(text[position] - b'0');
        seen_digit = true;
        position += 1;
    }
    if position < text.len() && text[position] == b'.' {
        position += 1;
        while position < text.len() && text[position].is_ascii_digit() {
            digits.push(text[position] - b'0');
            fraction_digits += 1;
            seen_digit = true;
            position += 1;
        }
    }
    if !seen_digit {
        return None;
    }
    let mut exponent: i64 = 0;
    if position < text.len() && text[position] == b'e' {
        position += 1;
        let negative = match text.get(position) {
            Some(b'-') => {
                position += 1;
                true
            }
            Some(b'+') => {
                position += 1;
                false
            }
            _ => false,
        };
        let start = position;
        while position < text.len() && text[position].is_ascii_digit() {
            // Saturating: anything this large is out of range anyway.
            exponent = exponent
                .saturating_mul(10)
                .saturating_add(i64::from(text[position] - b'0'));
            position += 1;
        }
        if position == start {
            // strtold stops before the `e`: trailing bytes.
            return None;
        }
        if negative {
            exponent = -exponent;
        }
    }
    if position != text.len() {
        return None;
    }
    // Leading zeros carry nothing.
    let first = digits.iter().position(|&d| d != 0);
    let Some(first) = first else {
        return Some(Exact::Zero);
    };
    let digits = &digits[first..];
    let exponent = exponent.saturating_sub(fraction_digits);
    // The magnitude is about 10^(digits.len() + exponent).
    let magnitude = digits.len() as i64 + exponent;
    if magnitude > DECIMAL_EXPONENT_LIMIT {
        return Some(Exact::TooLarge);
    }
    if magnitude < -DECIMAL_EXPONENT_LIMIT {
        return Some(Exact::TooSmall);
    }
    let mut big = Big::default();
    for &digit in digits {
        big = big.mul_small(10).add(&Big::from_u64(u64::from(digit)));
    }
    if exponent >= 0 {
        let big = big.mul(&Big::pow10(exponent as u32));
        return Some(Exact::Value { big, exponent: 0 });
    }
    // big / 10^k with enough quotient bits to round, plus a sticky unit
    // for a remainder.
    let divisor = Big::pow10((-exponent) as u32);
    let wanted = i64::from(PRECISION_BITS) + 3;
    let shift = (wanted + divisor.bits() as i64 - big.bits() as i64).max(0) as u32;
    let (quotient, remainder) = big.shl(shift).div_rem(&divisor);
    let big = if remainder.is_zero() {
        quotient
    } else {
        // One more bit below everything, set: the inexact rest.
        quotient.shl(1).add(&Big::from_u64(1))
    };
    let exponent = -(shift as i64) - i64::from(!remainder.is_zero());
    Some(Exact::Value { big, exponent })
}

/// `strtold`'s hexadecimal syntax after `0x`: hex digits, an optional
/// point and hex digits (at least one digit), an optional `p` exponent.
fn parse_hex(text: &[u8]) -> Option<Exact> {
    let mut position = 0;
    let mut big = Big::default();
    let mut exponent: i64 = 0;
    let mut seen_digit = false;
    let hex = |b: u8| (b as char).to_digit(16);
    while let Some(digit) = text.get(position).and_then(|&b| hex(b)) {
        big = big.shl(4).add(&Big::from_u64(u64::from(digit)));
        seen_digit = true;
        position += 1;
        if big.bits() > 20_000 {
            return Some(Exact::TooLarge);
        }
    }
    if text.get(position) == Some(&b'.') {
        position += 1;
        while let Some(digit) = text.get(position).and_then(|&b| hex(b)) {
            big = big.shl(4).add(&Big::from_u64(u64::from(digit)));
            exponent -= 4;
            seen_digit = true;
            position += 1;
        }
    }
    if !seen_digit {
        return None;
    }
    if text.get(position) == Some(&b'p') {
        position += 1;
        let negative = match text.get(position) {
            Some(b'-') => {
                position += 1;
                true
            }
            Some(b'+') => {
                position += 1;
                false
            }
            _ => false,
        };
        let start = position;
        let mut power: i64 = 0;
        while position < text.len() && text[position].is_ascii_digit() {
            power = power
                .saturating_mul(10)
                .saturating_add(i64::from(text[position] - b'0'));
            position += 1;
        }
        if position == start {
            return None;
        }
        exponent = exponent.saturating_add(if negative { -power } else { power });
    }
    if position != text.len() {
        return None;
    }
    if big.is_zero() {
        return Some(Exact::Zero);
    }
    let magnitude = big.bits() as i64 + exponent;
    if magnitude > Q_MAX + 64 + 8 {
        return Some(Exact::TooLarge);
    }
    if magnitude < Q_MIN - 8 {
        return Some(Exact::TooSmall);
    }
    Some(Exact::Value { big, exponent })
}

enum Rounded {
    Finite(LongDouble),
    Overflow,
}

/// Rounds `big × 2^exponent` (plus, if `sticky`, something positive below
/// its last bit) to the format: 64 significant bits, or fewer for a
/// subnormal; to nearest, ties to even.
fn round(negative: bool, big: Big, exponent: i64, sticky: bool) -> Rounded {
    if big.is_zero() {
        return Rounded::Finite(LongDouble {
            negative,
            ..LongDouble::ZERO
        });
    }
    let bits = big.bits() as i64;
    let mut shift = bits - i64::from(PRECISION_BITS);
    if exponent + shift < Q_MIN {
        shift = Q_MIN - exponent;
    }
    let (mut significand, mut result_exponent) = if shift > 0 {
        let (kept, rest) = big.shr_with_rest(shift as u32);
        let rest = match (rest, sticky) {
            (Rest::Zero, true) => Rest::BelowHalf,
            (Rest::Half, true) => Rest::AboveHalf,
            (rest, _) => rest,
        };
        let round_up = match rest {
            Rest::Zero | Rest::BelowHalf => false,
            Rest::AboveHalf => true,
            Rest::Half => kept.is_odd(),
        };
        let kept = if round_up {
            kept.add(&Big::from_u64(1))
        } else {
            kept
        };
        (kept, exponent + shift)
    } else {
        // Exact in the format (a sticky rest is below half an ulp).
        (big.shl((-shift) as u32), exponent + shift)
    };
    if significand.bits() > PRECISION_BITS {
        significand = significand.shr_with_rest(1).0;
        result_exponent += 1;
    }
    if result_exponent > Q_MAX {
        return Rounded::Overflow;
    }
    Rounded::Finite(LongDouble {
        negative,
        significand: significand.to_u64(),
        exponent: result_exponent,
    })
}

/// What the bits shifted out were, against half of their weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rest {
    Zero,
    BelowHalf,
    Half,
    AboveHalf,
}

/// A non-negative integer, 32-bit limbs, least significant first, no
/// trailing zero limb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Big {
    limbs: Vec<u32>,
}

impl Big {
    fn from_u64(value: u64) -> Big {
        let mut big = Big {
            limbs: vec![value as u32, (value >> 32) as u32],
        };
        big.trim();
        big
    }

    fn trim(&mut self) {
        while self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
    }

    fn is_zero(&self) -> bool {
        self.limbs.is_empty()
    }

    fn is_odd(&self) -> bool {
        self.limbs.first().is_some_and(|limb| limb & 1 == 1)
    }

    fn bits(&self) -> u32 {
        match self.limbs.last() {
            Some(top) => (self.limbs.len() as u32 - 1) * 32 + (32 - top.leading_zeros()),
            None => 0,
        }
    }

    fn bit(&self, index: u32) -> bool {
        self.limbs
            .get((index / 32) as usize)
            .is_some_and(|limb| (limb >> (index % 32)) & 1 == 1)
    }

    /// The value, which fits in 64 bits.
    fn to_u64(&self) -> u64 {
        let low = u64::from(self.limbs.first().copied().unwrap_or(0));
        let high = u64::from(self.limbs.get(1).copied().unwrap_or(0));
        low | (high << 32)
    }

    fn pow10(power: u32) -> Big {
        let mut big = Big::from_u64(1);
        let mut left = power;
        while left >= 9 {
            big = big.mul_small(1_000_000_000);
            left -= 9;
        }
        big.mul_small(10u32.pow(left))
    }

    fn mul_small(&self, factor: u32) -> Big {
        let mut carry = 0u64;
        let mut limbs = Vec::with_capacity(self.limbs.len() + 1);
        for &limb in &self.limbs {
            let product = u64::from(limb) * u64::from(factor) + carry;
            limbs.push(product as u32);
            carry = product >> 32;
        }
        limbs.push(carry as u32);
        let mut big = Big { limbs };
        big.trim();
        big
    }

    fn mul(&self, other: &Big) -> Big {
        let mut limbs = vec![0u32; self.limbs.len() + other.limbs.len() + 1];
        for (i, &a) in self.limbs.iter().enumerate() {
            let mut carry = 0u64;
            for (j, &b) in other.limbs.iter().enumerate() {
                let sum = u64::from(limbs[i + j]) + u64::from(a) * u64::from(b) + carry;
                limbs[i + j] = sum as u32;
                carry = sum >> 32;
            }
            let mut k = i + other.limbs.len();
            while carry != 0 {
                let sum = u64::from(limbs[k]) + carry;
                limbs[k] = sum as u32;
                carry = sum >> 32;
                k += 1;
            }
        }
        let mut big = Big { limbs };
        big.trim();
        big
    }

    fn add(&self, other: &Big) -> Big {
        let length = self.limbs.len().max(other.limbs.len());
        let mut limbs = Vec::with_capacity(length + 1);
        let mut carry = 0u64;
        for i in 0..length {
            let sum = u64::from(self.limbs.get(i).copied().unwrap_or(0))
                + u64::from(other.limbs.get(i).copied().unwrap_or(0))
                + carry;
            limbs.push(sum as u32);
            carry = sum >> 32;
        }
        limbs.push(carry as u32);
        let mut big = Big { limbs };
        big.trim();
        big
    }

    /// `self − other`, `other ≤ self`.
    fn sub(&self, other: &Big) -> Big {
        let mut limbs = Vec::with_capacity(self.limbs.len());
        let mut borrow = 0i64;
        for i in 0..self.limbs.len() {
            let mut difference = i64::from(self.limbs[i])
                - i64::from(other.limbs.get(i).copied().unwrap_or(0))
                - borrow;
            borrow = 0;
            if difference < 0 {
                difference += 1 << 32;
                borrow = 1;
            }
            limbs.push(difference as u32);
        }
        let mut big = Big { limbs };
        big.trim();
        big
    }

    fn shl(&self, shift: u32) -> Big {
        if self.is_zero() {
            return Big::default();
        }
        let (whole, part) = ((shift / 32) as usize, shift % 32);
        let mut limbs = vec![0u32; whole];
        let mut carry = 0u32;
        for &limb in &self.limbs {
            if part == 0 {
                limbs.push(limb);
            } else {
                limbs.push((limb << part) | carry);
                carry = limb >> (32 - part);
            }
        }
        limbs.push(carry);
        let mut big = Big { limbs };
        big.trim();
        big
    }

    /// `self >> shift`, and what the bits shifted out were against half
    /// of their weight.
    fn shr_with_rest(&self, shift: u32) -> (Big, Rest) {
        if shift == 0 {
            return (self.clone(), Rest::Zero);
        }
        let half = self.bit(shift - 1);
        let below = (0..shift - 1).any(|index| self.bit(index));
        let rest = match (half, below) {
            (false, false) => Rest::Zero,
            (false, true) => Rest::BelowHalf,
            (true, false) => Rest::Half,
            (true, true) => Rest::AboveHalf,
        };
        let (whole, part) = ((shift / 32) as usize, shift % 32);
        if whole >= self.limbs.len() {
            return (Big::default(), rest);
        }
        let source = &self.limbs[whole..];
        let mut limbs = Vec::with_capacity(source.len());
        for (i, &limb) in source.iter().enumerate() {
            let next = source.get(i + 1).copied().unwrap_or(0);
            limbs.push(if part == 0 {
                limb
            } else {
                (limb >> part) | (next << (32 - part))
            });
        }
        let mut big = Big { limbs };
        big.trim();
        (big, rest)
    }

    /// Quotient and remainder, one quotient bit at a time (the callers'
    /// quotients have about 70 bits).
    fn div_rem(&self, divisor: &Big) -> (Big, Big) {
        if self.cmp(divisor) == Ordering::Less {
            return (Big::default(), self.clone());
        }
        let mut remainder = self.clone();
        let mut quotient = Big::default();
        let top = self.bits() - divisor.bits();
        for index in (0..=top).rev() {
            let shifted = divisor.shl(index);
            if remainder.cmp(&shifted) != Ordering::Less {
                remainder = remainder.sub(&shifted);
                quotient = quotient.add(&Big::from_u64(1).shl(index));
            }
        }
        (quotient, remainder)
    }

    fn cmp(&self, other: &Big) -> Ordering {
        self.limbs
            .len()
            .cmp(&other.limbs.len())
            .then_with(|| self.limbs.iter().rev().cmp(other.limbs.iter().rev()))
    }

    fn to_decimal(&self) -> String {
        if self.is_zero() {
            return "0".to_string();
        }
        const CHUNK: u64 = 1_000_000_000;
        let mut chunks = Vec::new();
        let mut limbs = self.limbs.clone();
        while !limbs.is_empty() {
            let mut remainder = 0u64;
            for limb in limbs.iter_mut().rev() {
                let value = (remainder << 32) | u64::from(*limb);
                *limb = (value / CHUNK) as u32;
                remainder = value % CHUNK;
            }
            while limbs.last() == Some(&0) {
                limbs.pop();
            }
            chunks.push(remainder);
        }
        let mut text = chunks.pop().map(|c| c.to_string()).unwrap_or_default();
        for chunk in chunks.iter().rev() {
            text.push_str(&format!("{chunk:09}"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> LongDouble {
        LongDouble::parse(text.as_bytes())
            .unwrap_or_else(|| panic!("{text} parses"))
            .unwrap_or_else(|_| panic!("{text} is finite"))
    }

    fn sum(a: &str, b: &str) -> String {
        parse(a).plus(parse(b)).unwrap().format()
    }

    /// Each expected value is what redis-server 7.0.15 (x86-64) answered
    /// for `SET k a` then `INCRBYFLOAT k b`.
    #[test]
    fn sums_are_formatted_as_redis_formats_them() {
        assert_eq!(sum("10.5", "0.1"), "10.6");
        assert_eq!(sum("10.6", "-5"), "5.6");
        assert_eq!(sum("5.0e3", "2.0e2"), "5200");
        assert_eq!(sum("3.0e3", "2.0e2"), "3200");
        assert_eq!(sum("1e10", "0.1"), "10000000000.09999999962747097");
        assert_eq!(
            sum("10000000000.09999999962747097", "0x10"),
            "10000000016.09999999962747097"
        );
        assert_eq!(sum("0.1", "0.2"), "0.3");
        assert_eq!(sum("5", "0.0000000000000000035"), "5");
        assert_eq!(sum("0", "0.000000000000000005"), "0");
        assert_eq!(sum("0", "0.000000000000000010"), "0.00000000000000001");
        assert_eq!(
            sum("0.000000000000000005", "0.000000000000000010"),
            "0.00000000000000002"
        );
        assert_eq!(sum("2.5e-17", "0"), "0.00000000000000002");
        // 2^-18 is a tie at the 17th decimal: to even.
        assert_eq!(sum("0.000003814697265625", "0"), "0.00000381469726562");
        assert_eq!(sum("-0.000000000000000001", "0"), "0");
        assert_eq!(sum("-0", "-0"), "0");
        assert_eq!(sum("1", "0x1p-2"), "1.25");
        assert_eq!(sum("1.25", "+.5"), "1.75");
        assert_eq!(sum("10", "00001.5e+00"), "11.5");
        assert_eq!(sum("3200", "1e30"), "1000000000000000000024696061952");
        assert_eq!(
            sum("1.7976931348623157e308", "1e308")[..40],
            *"2797693134862315700023522404413500787892"
        );
        let big = sum("1", "1e400");
        assert!(big.starts_with("10000000000000000000281880683947586514586453433629052038625910693539685534008629862039363994848324160522094053927317616200295822777259255734023828976593340661017797447434546173917862448116674971723778943824391593338047470675026246684401359237513603830343735485505244955964979021825038280091068414947402456898653040951017512658092615827588920183472511643316591362664138176309734806343732497430221946880"), "{big}");
        assert_eq!(big.len(), 401);
        assert_eq!(sum(&big, "1e-4940"), big);
    }

    #[test]
    fn what_redis_refuses_as_a_float_is_refused() {
        for text in [
            "", " 1", "1 ", "1e", ".", "-", "nan", "-nan", "abc", "1e-5000", "1e5000", "0x",
            "1..2", "\t1",
        ] {
            assert_eq!(LongDouble::parse(text.as_bytes()), None, "{text:?}");
        }
        assert_eq!(LongDouble::parse(&[b'1'; LONG_DOUBLE_CHARS_MAX + 1]), None);
        assert!(
            LongDouble::parse(&[b'1'; LONG_DOUBLE_CHARS_MAX - 10]).is_none(),
            "10^5108 overflows"
        );
        for text in ["inf", "-INF", "Infinity"] {
            assert_eq!(
                LongDouble::parse(text.as_bytes()),
                Some(Err(NotFinite::Infinite)),
                "{text}"
            );
        }
        // A subnormal is a value; zero written as zero too.
        assert!(LongDouble::parse(b"1e-4940").unwrap().is_ok());
        assert_eq!(parse("0e-99999").format(), "0");
        assert_eq!(parse("1\0abc").format(), "1");
    }

    #[test]
    fn an_overflowing_sum_is_infinite() {
        let largest = LongDouble {
            negative: false,
            significand: u64::MAX,
            exponent: Q_MAX,
        };
        assert_eq!(largest.plus(largest), Err(NotFinite::Infinite));
        assert!(largest.plus(parse("-1")).is_ok());
    }
}
