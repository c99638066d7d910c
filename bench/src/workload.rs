//! The seed workload: fixed-size keys, incompressible values, and orders.
//!
//! Keys are `KEY_SIZE_BYTES` ASCII bytes: a short prefix naming the phase
//! (`user:` for the loaded data set, others for later phases) followed by a
//! zero-padded decimal id. Values are windows into one buffer of random
//! bytes, so every value is incompressible on its own, and producing one
//! costs nothing inside a timed loop.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};

/// Length of every benchmark key.
pub const KEY_SIZE_BYTES: usize = 25;
/// Size of the random buffer values are cut from.
pub const VALUE_POOL_SIZE_BYTES: usize = 64 * 1024 * 1024;
/// Prefix of the keys of the loaded data set.
pub const LOADED_PREFIX: &[u8] = b"user:";

/// One benchmark key on the stack.
pub type Key = [u8; KEY_SIZE_BYTES];

/// Writes `prefix` then `id` zero-padded to fill [`KEY_SIZE_BYTES`].
///
/// Panics if the prefix leaves too few digits for `id` (a bug in the
/// benchmark, not a runtime condition).
pub fn key(prefix: &[u8], id: u64) -> Key {
    let mut out = [b'0'; KEY_SIZE_BYTES];
    assert!(prefix.len() < KEY_SIZE_BYTES, "key prefix too long");
    out[..prefix.len()].copy_from_slice(prefix);
    let mut rest = id;
    let mut pos = KEY_SIZE_BYTES;
    while rest > 0 {
        assert!(pos > prefix.len(), "id {id} does not fit after the prefix");
        pos -= 1;
        out[pos] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    out
}

/// A buffer of random bytes that values are windows of.
#[derive(Debug)]
pub struct ValuePool {
    bytes: Vec<u8>,
}

impl ValuePool {
    /// A pool of `size` random bytes from `seed`.
    pub fn new(seed: u64, size: usize) -> ValuePool {
        let mut bytes = vec![0u8; size];
        SmallRng::seed_from_u64(seed).fill_bytes(&mut bytes);
        ValuePool { bytes }
    }

    /// Value number `n` of `len` bytes: a window at a pseudo-random offset.
    pub fn value(&self, n: u64, len: usize) -> &[u8] {
        assert!(len < self.bytes.len(), "value larger than the pool");
        let span = (self.bytes.len() - len) as u64;
        let offset = (splitmix64(n) % span) as usize;
        &self.bytes[offset..offset + len]
    }
}

/// The ids `0..n` in a random order from `seed`.
pub fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = (0..n).collect();
    ids.shuffle(&mut SmallRng::seed_from_u64(seed));
    ids
}

/// A well-mixed 64-bit hash (splitmix64 finaliser).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_fixed_length_and_sort_by_id() {
        assert_eq!(&key(b"user:", 42), b"user:00000000000000000042");
        assert_eq!(&key(b"user:", 0), b"user:00000000000000000000");
        assert!(key(b"user:", 9) < key(b"user:", 10));
        assert_eq!(key(b"s4k:", u64::MAX).len(), KEY_SIZE_BYTES);
    }

    #[test]
    fn values_are_windows_of_the_requested_length() {
        let pool = ValuePool::new(1, 1 << 16);
        assert_eq!(pool.value(7, 4096).len(), 4096);
        assert_ne!(pool.value(1, 64), pool.value(2, 64));
        // Random bytes: all 256 byte values show up in a 4 KiB value.
        let distinct: std::collections::HashSet<u8> = pool.value(3, 4096).iter().copied().collect();
        assert!(distinct.len() > 250);
    }

    #[test]
    fn shuffled_is_a_permutation() {
        let mut ids = shuffled(1000, 5);
        assert_ne!(ids, (0..1000).collect::<Vec<_>>());
        ids.sort_unstable();
        assert_eq!(ids, (0..1000).collect::<Vec<_>>());
    }
}
