//! Applying Redis requests ([`crate::redis`]) inside an entry.

use super::{ApplyError, EntryWrite};
use crate::command::Outcome;
use crate::redis::RedisRequest;

impl EntryWrite<'_> {
    /// Applies one Redis request.
    pub(super) fn evaluate_redis(&mut self, request: &RedisRequest) -> Result<Outcome, ApplyError> {
        let _ = request;
        Ok(Outcome::Rejected {
            reason: "Redis commands are not applied yet".to_string(),
        })
    }
}
