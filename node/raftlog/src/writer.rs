//! The writer thread: every write (append, segment creation, metadata,
//! truncate, purge) executed in order, appends for the same segment grouped
//! under one fsync (group commit), and the poison a failed write or fsync
//! leaves behind.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use tokio::sync::oneshot;
use vfs::{Vfs, VfsFile};

use crate::error::LogError;
use crate::format::{PURGED_FILE, TMP_SUFFIX, segment_header};
use crate::limits::{GROUP_COMMIT_BATCHES_MAX, LOG_FILL_AHEAD_BYTES};
use crate::options::FsyncObserver;

// ---------------------------------------------------------------------------
// Poisoning
// ---------------------------------------------------------------------------

/// Set by the first failed write or fsync; every later write is refused
/// with the first failure (the shared latch of `vfs`, with the log store's
/// own error and log line).
#[derive(Debug, Default)]
pub(crate) struct Poison(vfs::Poison);

impl Poison {
    pub(crate) fn check(&self) -> Result<(), LogError> {
        match self.0.cause() {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned { cause }),
        }
    }

    pub(crate) fn set(&self, err: &LogError) {
        if self.0.set(err) {
            tracing::error!(error = %err, "raft log poisoned: refusing further writes");
        }
    }
}

// ---------------------------------------------------------------------------
// The writer thread
// ---------------------------------------------------------------------------

/// Where the writer sends the outcome of a command the caller waits for.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, LogError>>;

/// One laid-out append batch: its bytes and where they go.
pub(crate) struct AppendJob {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: Arc<Path>,
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
    /// Called after the fsync covering this batch (or with the failure).
    pub(crate) done: Box<dyn FnOnce(Result<(), LogError>) + Send>,
}

/// What the writer thread is asked to do, in queue order.
pub(crate) enum Command {
    Append(AppendJob),
    /// Calls `done` once every earlier command is done (an empty append).
    Barrier {
        done: Box<dyn FnOnce(Result<(), LogError>) + Send>,
    },
    /// Create a segment: the previous one's zeros cut (and fsynced), then
    /// create, header, fsync, directory fsync.
    Create {
        path: PathBuf,
        first_index: u64,
        reply: Reply<Arc<dyn VfsFile>>,
    },
    /// Replace a metadata file atomically.
    SaveMeta {
        name: &'static str,
        bytes: Vec<u8>,
        reply: Reply<()>,
    },
    /// Delete whole segments (highest first, each durable before the next),
    /// then cut one segment and fsync it.
    Truncate {
        remove: Vec<Arc<Path>>,
        cut: Option<(Arc<dyn VfsFile>, Arc<Path>, u64)>,
        reply: Reply<()>,
    },
    /// Save the purge point, then delete segments wholly below it (lowest first).
    Purge {
        meta: Vec<u8>,
        remove: Vec<Arc<Path>>,
        reply: Reply<()>,
    },
}

/// The state of the writer thread.
pub(crate) struct Writer {
    pub(crate) vfs: Arc<dyn Vfs>,
    pub(crate) dir: PathBuf,
    pub(crate) poison: Arc<Poison>,
    pub(crate) fsync_observer: Option<FsyncObserver>,
    /// The segment appended to last, and how far it holds records and
    /// zeros ([`LOG_FILL_AHEAD_BYTES`]); `None` until the first append
    /// after open, a new segment, or the removal of that segment.
    pub(crate) fill: Option<Fill>,
    /// The directory's `LOCK`, released when the thread ends (after the
    /// store's last write and the seal of its zeros).
    pub(crate) _dir_lock: vfs::DirLock,
}

/// The zeros past the records of the segment appended to last.
pub(crate) struct Fill {
    file: Arc<dyn VfsFile>,
    path: Arc<Path>,
    /// End of the last record written.
    written: u64,
    /// End of the zeros written after it (at least `written`).
    zeroed: u64,
}

impl Writer {
    /// Runs commands until every sender is gone, then cuts the zeros off
    /// the last segment (recovery would cut them anyway, as a torn tail).
    pub(crate) fn run(mut self, rx: mpsc::Receiver<Command>) {
        let mut next: Option<Command> = None;
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => match rx.recv() {
                    Ok(command) => command,
                    Err(_) => {
                        let _ = self.guarded(|w| w.seal_fill());
                        return;
                    }
                },
            };
            match command {
                Command::Append(first) => {
                    let mut group = vec![first];
                    while group.len() < GROUP_COMMIT_BATCHES_MAX {
                        match rx.try_recv() {
                            Ok(Command::Append(job)) if job.path == group[0].path => {
                                group.push(job)
                            }
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let result = self.guarded(|w| w.write_group(&group));
                    for job in group {
                        let outcome = match &result {
                            Ok(()) => Ok(()),
                            Err(LogError::Poisoned { cause }) => Err(LogError::Poisoned {
                                cause: cause.clone(),
                            }),
                            Err(err) => Err(LogError::Poisoned {
                                cause: err.to_string(),
                            }),
                        };
                        (job.done)(outcome);
                    }
                }
                Command::Barrier { done } => done(self.poison.check()),
                Command::Create {
                    path,
                    first_index,
                    reply,
                } => {
                    // The segment before it stops being the last one: its
                    // zeros go first (recovery accepts a torn tail, zeros
                    // included, only in the last segment).
                    let result = self.guarded(|w| {
                        w.seal_fill()?;
                        w.create_segment(&path, first_index)
                    });
                    let _ = reply.send(result);
                }
                Command::SaveMeta { name, bytes, reply } => {
                    let result = self.guarded(|w| w.save_meta(name, &bytes));
                    let _ = reply.send(result);
                }
                Command::Truncate { remove, cut, reply } => {
                    self.forget_fill(&remove);
                    let result = self.guarded(|w| {
                        for path in &remove {
                            w.remove_durably(path)?;
                        }
                        if let Some((file, path, len)) = &cut {
                            file.truncate(*len)
                                .map_err(|e| LogError::io("truncate", path, e))?;
                            file.sync().map_err(|e| LogError::io("fsync", path, e))?;
                        }
                        Ok(())
                    });
                    // A cut segment ends at the cut: no zeros after it.
                    if let (Some(fill), Some((_, path, len))) = (&mut self.fill, &cut)
                        && fill.path == *path
                    {
                        fill.written = *len;
                        fill.zeroed = *len;
                    }
                    let _ = reply.send(result);
                }
                Command::Purge {
                    meta,
                    remove,
                    reply,
                } => {
                    self.forget_fill(&remove);
                    let result = self.guarded(|w| {
                        w.save_meta(PURGED_FILE, &meta)?;
                        for path in &remove {
                            w.remove_durably(path)?;
                        }
                        Ok(())
                    });
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// Runs a write operation unless poisoned; a failure poisons.
    fn guarded<T>(
        &mut self,
        op: impl FnOnce(&mut Self) -> Result<T, LogError>,
    ) -> Result<T, LogError> {
        self.poison.check()?;
        op(self).inspect_err(|err| self.poison.set(err))
    }

    fn write_group(&mut self, group: &[AppendJob]) -> Result<(), LogError> {
        let mut wrote = false;
        let mut end = 0;
        for job in group {
            if job.bytes.is_empty() {
                continue;
            }
            job.file
                .write_all_at(&job.bytes, job.offset)
                .map_err(|e| LogError::io("write", &job.path, e))?;
            wrote = true;
            end = end.max(job.offset + job.bytes.len() as u64);
        }
        // NEGATIVE CONTROL (feature nc-skip-log-fsync): no zeros either, so
        // nothing ever truncates and fsyncs the segment (at a rotation or
        // close) and its records stay as unsynced as the control says.
        if wrote && !cfg!(feature = "nc-skip-log-fsync") {
            self.fill_ahead(&group[0], end)?;
        }
        // NEGATIVE CONTROL (feature nc-skip-log-fsync): appended entries are
        // never fsynced (lost at a power cut; only the lazy disk shows it).
        #[cfg(feature = "nc-skip-log-fsync")]
        let wrote = {
            let _ = wrote;
            false
        };
        if wrote {
            // One fsync for the whole group; never retried on failure.
            let started = Instant::now();
            let synced = group[0].file.sync();
            if let Some(observe) = &self.fsync_observer {
                observe(started.elapsed());
            }
            synced.map_err(|e| LogError::io("fsync", &group[0].path, e))?;
        }
        Ok(())
    }

    /// Notes that the segment of `job` now holds records up to `end`, and
    /// writes [`LOG_FILL_AHEAD_BYTES`] of zeros after them when they reached
    /// the end of the zeros written before (the batch's fsync covers them).
    /// Appends only ever go to the end of the last segment, so nothing past
    /// `end` is a record.
    fn fill_ahead(&mut self, job: &AppendJob, end: u64) -> Result<(), LogError> {
        let fill = match &mut self.fill {
            Some(fill) if fill.path == job.path => fill,
            _ => self.fill.insert(Fill {
                file: job.file.clone(),
                path: job.path.clone(),
                written: end,
                zeroed: 0,
            }),
        };
        fill.written = end;
        // The zeros are as durable as the records they follow (the group's
        // one fsync comes after this). Records that end exactly where the
        // zeros do extend them too: the next append would grow the file.
        if end >= fill.zeroed {
            let zeros = vec![0u8; LOG_FILL_AHEAD_BYTES as usize];
            fill.file
                .write_all_at(&zeros, end)
                .map_err(|e| LogError::io("write", &fill.path, e))?;
            fill.zeroed = end + LOG_FILL_AHEAD_BYTES;
        }
        Ok(())
    }

    /// Cuts the zeros off the segment appended to last (durably) and
    /// forgets it.
    fn seal_fill(&mut self) -> Result<(), LogError> {
        let Some(fill) = self.fill.take() else {
            return Ok(());
        };
        if fill.zeroed > fill.written {
            fill.file
                .truncate(fill.written)
                .map_err(|e| LogError::io("truncate", &fill.path, e))?;
            fill.file
                .sync()
                .map_err(|e| LogError::io("fsync", &fill.path, e))?;
        }
        Ok(())
    }

    /// Forgets the fill of a segment about to be removed.
    fn forget_fill(&mut self, remove: &[Arc<Path>]) {
        if self
            .fill
            .as_ref()
            .is_some_and(|fill| remove.contains(&fill.path))
        {
            self.fill = None;
        }
    }

    fn create_segment(&self, path: &Path, first_index: u64) -> Result<Arc<dyn VfsFile>, LogError> {
        let file = self
            .vfs
            .create(path)
            .map_err(|e| LogError::io("create", path, e))?;
        file.write_all_at(&segment_header(first_index), 0)
            .map_err(|e| LogError::io("write", path, e))?;
        file.sync().map_err(|e| LogError::io("fsync", path, e))?;
        self.sync_dir()?;
        tracing::debug!(segment = %path.display(), "raft log segment created");
        Ok(file)
    }

    fn save_meta(&self, name: &str, bytes: &[u8]) -> Result<(), LogError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}{TMP_SUFFIX}"));
        let file = self
            .vfs
            .create(&tmp)
            .map_err(|e| LogError::io("create", &tmp, e))?;
        file.write_all_at(bytes, 0)
            .map_err(|e| LogError::io("write", &tmp, e))?;
        file.sync().map_err(|e| LogError::io("fsync", &tmp, e))?;
        self.vfs
            .rename(&tmp, &path)
            .map_err(|e| LogError::io("rename", &tmp, e))?;
        // NEGATIVE CONTROL (feature nc-rename-no-dir-fsync): the rename is
        // not made durable (no directory fsync), so a power cut can undo it
        // and bring back the previous vote or purge point (only the lazy
        // disk shows it).
        if cfg!(feature = "nc-rename-no-dir-fsync") {
            return Ok(());
        }
        self.sync_dir()
    }

    fn remove_durably(&self, path: &Path) -> Result<(), LogError> {
        self.vfs
            .remove(path)
            .map_err(|e| LogError::io("remove", path, e))?;
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), LogError> {
        self.vfs
            .sync_dir(&self.dir)
            .map_err(|e| LogError::io("fsync directory", &self.dir, e))
    }
}
