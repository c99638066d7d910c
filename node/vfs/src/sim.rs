//! [`SimFs`]: an in-memory file system for tests that keeps track of what was
//! made durable, so a test can cut the power, and that fails or holds fsyncs
//! on command (feature `sim`, off by default).
//!
//! Durability follows POSIX: file contents become durable at `sync`, and
//! creations, renames and deletions only at `sync_dir` of their directory.
//! [`SimFs::power_cut`] returns the disk as a machine would find it after a
//! power failure: the durable names, each with its synced bytes, optionally
//! plus an in-order prefix of the writes and truncations made since its last
//! sync, the first write left out torn at a byte.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::traits::{Vfs, VfsFile};

/// What survives of unsynced bytes at a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Torn {
    /// Only fsynced bytes survive.
    Nothing,
    /// Of each file's writes and truncations since its last sync, a
    /// pseudo-random prefix (chosen from this seed) reached the disk in
    /// order, the write after it cut at a pseudo-random byte: what a
    /// machine finds when the power went in the middle of a write-back.
    Prefix(u64),
}

#[derive(Debug, Default)]
struct Faults {
    /// Every sync (file or directory) fails with EIO.
    fail_sync: AtomicBool,
    /// Writes succeed this many more times, then fail with EIO; -1 = never fail.
    writes_before_failure: AtomicI64,
    /// Number of file syncs that succeeded.
    syncs: AtomicU64,
    /// Microseconds every file sync takes (a slow disk), 0 = instant.
    sync_delay_us: AtomicU64,
    /// File syncs are held (block before they make anything durable) while
    /// this is `true`; `sync_released` wakes them when it turns `false`.
    sync_hold: Mutex<SyncHold>,
    sync_released: Condvar,
}

#[derive(Debug, Default)]
struct SyncHold {
    held: bool,
    /// File syncs blocked right now.
    waiting: u64,
}

/// A change to a file since its last sync.
#[derive(Debug)]
enum Unsynced {
    Write(usize, Vec<u8>),
    Truncate(usize),
}

#[derive(Debug, Default)]
struct FileState {
    data: Vec<u8>,
    synced: Vec<u8>,
    /// A write or truncate went below the synced length since the last sync.
    rewritten: bool,
    /// Every change since the last sync, in order (what a power cut may
    /// have written back a prefix of).
    unsynced: Vec<Unsynced>,
}

/// `bytes` written at `offset` of `data`, the file growing with zeros.
fn write_into(data: &mut Vec<u8>, offset: usize, bytes: &[u8]) {
    if data.len() < offset + bytes.len() {
        data.resize(offset + bytes.len(), 0);
    }
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// xorshift64: deterministic for a seed, no extra dependency.
fn next_random(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

#[derive(Debug)]
struct SimFile {
    state: Mutex<FileState>,
    faults: Arc<Faults>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected failure: {what}"))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl VfsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let state = lock(&self.state);
        let offset = offset as usize;
        if offset >= state.data.len() {
            return Ok(0);
        }
        let n = buf.len().min(state.data.len() - offset);
        buf[..n].copy_from_slice(&state.data[offset..offset + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let budget = self.faults.writes_before_failure.load(Ordering::SeqCst);
        if budget == 0 {
            return Err(eio("write"));
        }
        if budget > 0 {
            self.faults
                .writes_before_failure
                .fetch_sub(1, Ordering::SeqCst);
        }
        let mut state = lock(&self.state);
        let offset = offset as usize;
        if offset < state.synced.len() {
            state.rewritten = true;
        }
        write_into(&mut state.data, offset, buf);
        state.unsynced.push(Unsynced::Write(offset, buf.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.faults.fail_sync.load(Ordering::SeqCst) {
            return Err(eio("fsync"));
        }
        let delay_us = self.faults.sync_delay_us.load(Ordering::SeqCst);
        if delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
        let mut hold = lock(&self.faults.sync_hold);
        if hold.held {
            hold.waiting += 1;
            while hold.held {
                hold = self
                    .faults
                    .sync_released
                    .wait(hold)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            hold.waiting -= 1;
        }
        drop(hold);
        let mut state = lock(&self.state);
        if state.rewritten || state.synced.len() > state.data.len() {
            state.synced = state.data.clone();
        } else {
            let from = state.synced.len();
            let tail = state.data[from..].to_vec();
            state.synced.extend_from_slice(&tail);
        }
        state.rewritten = false;
        state.unsynced.clear();
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.state).data.len() as u64)
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut state = lock(&self.state);
        if (len as usize) < state.synced.len() {
            state.rewritten = true;
        }
        state.data.resize(len as usize, 0);
        state.unsynced.push(Unsynced::Truncate(len as usize));
        Ok(())
    }
}

/// An in-memory file system that tracks durability; cheap to clone (clones
/// share the same disk).
#[derive(Clone, Debug, Default)]
pub struct SimFs {
    inner: Arc<SimInner>,
}

#[derive(Debug, Default)]
struct SimInner {
    /// The names a running program sees.
    live: Mutex<HashMap<PathBuf, Arc<SimFile>>>,
    /// The names that survive a power cut.
    durable: Mutex<HashMap<PathBuf, Arc<SimFile>>>,
    faults: Arc<Faults>,
}

impl SimFs {
    /// An empty disk.
    pub fn new() -> SimFs {
        let fs = SimFs::default();
        fs.inner
            .faults
            .writes_before_failure
            .store(-1, Ordering::SeqCst);
        fs
    }

    /// Makes every later sync fail (`true`) or succeed again (`false`).
    pub fn set_fail_sync(&self, fail: bool) {
        self.inner.faults.fail_sync.store(fail, Ordering::SeqCst);
    }

    /// Lets `count` more writes succeed, then fails every write; `None` stops failing.
    pub fn fail_writes_after(&self, count: Option<u64>) {
        let value = count.map_or(-1, |count| count as i64);
        self.inner
            .faults
            .writes_before_failure
            .store(value, Ordering::SeqCst);
    }

    /// Makes every file sync take this long, like a slow disk.
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.inner
            .faults
            .sync_delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// Holds every later file sync (`true`: it blocks, nothing made durable
    /// yet, until released) or releases the held ones (`false`), so a test
    /// can look at the state "written, fsync in flight" without timing.
    /// Directory syncs are not held. See [`SimFs::syncs_held`].
    pub fn hold_syncs(&self, hold: bool) {
        lock(&self.inner.faults.sync_hold).held = hold;
        if !hold {
            self.inner.faults.sync_released.notify_all();
        }
    }

    /// Number of file syncs blocked by [`SimFs::hold_syncs`] right now.
    pub fn syncs_held(&self) -> u64 {
        lock(&self.inner.faults.sync_hold).waiting
    }

    /// Number of successful file syncs so far.
    pub fn sync_count(&self) -> u64 {
        self.inner.faults.syncs.load(Ordering::SeqCst)
    }

    /// The disk as found after a power failure now, as a new file system.
    /// This one keeps working, but a test should stop using it.
    pub fn power_cut(&self, torn: Torn) -> SimFs {
        let fresh = SimFs::new();
        let durable = lock(&self.inner.durable);
        let mut rng = match torn {
            Torn::Nothing => 0,
            Torn::Prefix(seed) => seed | 1,
        };
        let mut paths: Vec<&PathBuf> = durable.keys().collect();
        paths.sort();
        let mut files = lock(&fresh.inner.live);
        for path in paths {
            let state = lock(&durable[path].state);
            let mut data = state.synced.clone();
            if rng != 0 && !state.unsynced.is_empty() {
                let whole = (next_random(&mut rng) % (state.unsynced.len() as u64 + 1)) as usize;
                for change in &state.unsynced[..whole] {
                    match change {
                        Unsynced::Write(offset, bytes) => write_into(&mut data, *offset, bytes),
                        Unsynced::Truncate(len) => data.resize(*len, 0),
                    }
                }
                if let Some(Unsynced::Write(offset, bytes)) = state.unsynced.get(whole) {
                    let part = (next_random(&mut rng) % (bytes.len() as u64 + 1)) as usize;
                    write_into(&mut data, *offset, &bytes[..part]);
                }
            }
            let file = Arc::new(SimFile {
                state: Mutex::new(FileState {
                    synced: data.clone(),
                    data,
                    ..FileState::default()
                }),
                faults: fresh.inner.faults.clone(),
            });
            files.insert(path.clone(), file);
        }
        *lock(&fresh.inner.durable) = files.clone();
        drop(files);
        fresh
    }

    /// Contents of a file as a running program sees it.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        lock(&self.inner.live)
            .get(path)
            .map(|file| lock(&file.state).data.clone())
    }

    /// Overwrites a file's bytes (live and durable), for corruption tests.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let file = Arc::new(SimFile {
            state: Mutex::new(FileState {
                data: bytes.to_vec(),
                synced: bytes.to_vec(),
                ..FileState::default()
            }),
            faults: self.inner.faults.clone(),
        });
        lock(&self.inner.live).insert(path.to_path_buf(), file.clone());
        lock(&self.inner.durable).insert(path.to_path_buf(), file);
    }

    fn check_dir_sync(&self) -> io::Result<()> {
        if self.inner.faults.fail_sync.load(Ordering::SeqCst) {
            return Err(eio("directory fsync"));
        }
        Ok(())
    }
}

impl Vfs for SimFs {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let file = Arc::new(SimFile {
            state: Mutex::default(),
            faults: self.inner.faults.clone(),
        });
        lock(&self.inner.live).insert(path.to_path_buf(), file.clone());
        Ok(file)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        match lock(&self.inner.live).get(path) {
            Some(file) => Ok(file.clone()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", path.display()),
            )),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = lock(&self.inner.live)
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut live = lock(&self.inner.live);
        let file = live.remove(from).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", from.display()),
            )
        })?;
        live.insert(to.to_path_buf(), file);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match lock(&self.inner.live).remove(path) {
            Some(_) => Ok(()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", path.display()),
            )),
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check_dir_sync()?;
        let live = lock(&self.inner.live);
        let mut durable = lock(&self.inner.durable);
        durable.retain(|path, _| path.parent() != Some(dir));
        for (path, file) in live.iter().filter(|(path, _)| path.parent() == Some(dir)) {
            durable.insert(path.clone(), file.clone());
        }
        Ok(())
    }

    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_cut_keeps_only_synced_bytes_and_durable_names() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let a = fs.create(&dir.join("a")).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        fs.sync_dir(dir).unwrap();
        a.sync().unwrap();
        a.write_all_at(b" world", 5).unwrap();
        let b = fs.create(&dir.join("b")).unwrap();
        b.write_all_at(b"x", 0).unwrap();
        b.sync().unwrap();
        let after = fs.power_cut(Torn::Nothing);
        assert_eq!(after.read_file(&dir.join("a")).unwrap(), b"hello");
        assert!(
            after.read_file(&dir.join("b")).is_none(),
            "b's name was never made durable"
        );
    }

    #[test]
    fn a_torn_power_cut_keeps_a_prefix_of_the_changes_in_order() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let a = fs.create(&dir.join("a")).unwrap();
        fs.sync_dir(dir).unwrap();
        a.write_all_at(&[0u8; 8], 0).unwrap();
        a.sync().unwrap();
        // Below the synced length, then past it, then a cut.
        a.write_all_at(b"abcd", 0).unwrap();
        a.write_all_at(b"efgh", 8).unwrap();
        a.truncate(10).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let found = fs
                .power_cut(Torn::Prefix(seed))
                .read_file(&dir.join("a"))
                .unwrap();
            // Every change before the torn one applied, none after it.
            let mut expected = vec![0u8; 8];
            let mut ok = false;
            for torn_at in 0..=4 {
                let mut candidate = expected.clone();
                candidate[..torn_at].copy_from_slice(&b"abcd"[..torn_at]);
                ok |= candidate == found;
            }
            expected[..4].copy_from_slice(b"abcd");
            for torn_at in 0..=4 {
                let mut candidate = expected.clone();
                candidate.extend_from_slice(&b"efgh"[..torn_at]);
                ok |= candidate == found;
            }
            expected.extend_from_slice(b"ef");
            ok |= expected == found;
            assert!(ok, "seed {seed}: {found:?} is no prefix of the changes");
            seen.insert(found);
        }
        assert!(
            seen.len() >= 8,
            "200 seeds reached only {} outcomes",
            seen.len()
        );
    }

    #[test]
    fn injected_failures() {
        let fs = SimFs::new();
        let a = fs.create(Path::new("/d/a")).unwrap();
        fs.set_fail_sync(true);
        assert!(a.sync().is_err());
        fs.set_fail_sync(false);
        fs.fail_writes_after(Some(1));
        assert!(a.write_all_at(b"1", 0).is_ok());
        assert!(a.write_all_at(b"2", 1).is_err());
    }

    #[test]
    fn a_held_sync_waits_for_its_release() {
        let fs = SimFs::new();
        let a = fs.create(Path::new("/d/a")).unwrap();
        a.write_all_at(b"x", 0).unwrap();
        fs.hold_syncs(true);
        let syncing = std::thread::spawn(move || a.sync());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while fs.syncs_held() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the sync never started"
            );
            std::thread::yield_now();
        }
        assert_eq!(fs.sync_count(), 0, "a held sync made nothing durable");
        fs.hold_syncs(false);
        syncing.join().unwrap().unwrap();
        assert_eq!((fs.syncs_held(), fs.sync_count()), (0, 1));
    }
}
