//! [`Poison`]: the storage-poisoning latch. After a failed write or fsync
//! a store must refuse every later write, reporting the first failure: on
//! Linux a second fsync of a file can report success for pages the first
//! one lost, so retrying would acknowledge data that is gone. The latch
//! keeps that first failure's description; the store decides what poisons
//! it and what a refusal looks like (its own error type and log line).

use std::fmt::Display;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once by the first storage failure, never cleared (a restart
/// recovers from the durable state instead). Cheap to check: one atomic
/// load while healthy.
#[derive(Debug, Default)]
pub struct Poison {
    poisoned: AtomicBool,
    /// The first failure's description; set before `poisoned`.
    cause: Mutex<Option<String>>,
}

impl Poison {
    /// A healthy latch.
    pub fn new() -> Poison {
        Poison::default()
    }

    /// Whether a failure was recorded.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// The first recorded failure's description; `None` while healthy.
    pub fn cause(&self) -> Option<String> {
        if !self.is_poisoned() {
            return None;
        }
        lock(&self.cause).clone()
    }

    /// Records `failure` unless an earlier one was recorded (the first
    /// failure is the one reported ever after). Returns whether this call
    /// poisoned the latch, so the caller logs the failure once.
    pub fn set(&self, failure: &dyn Display) -> bool {
        let mut cause = lock(&self.cause);
        let first = cause.is_none();
        if first {
            *cause = Some(failure.to_string());
        }
        self.poisoned.store(true, Ordering::SeqCst);
        first
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_failure() {
        let poison = Poison::new();
        assert!(!poison.is_poisoned());
        assert_eq!(poison.cause(), None);
        assert!(poison.set(&"disk full"));
        assert!(!poison.set(&"second failure"));
        assert!(poison.is_poisoned());
        assert_eq!(poison.cause().as_deref(), Some("disk full"));
    }
}
