//! File-system and process helpers: disk usage of a directory, dropping a
//! directory's files from the page cache, resident memory.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Bytes a directory tree occupies on disk (allocated blocks, like `du`).
pub fn disk_usage(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in
            std::fs::read_dir(&path).with_context(|| format!("listing {}", path.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// Asks the kernel to drop the cached pages of every file under `dir`
/// (`dd iflag=nocache count=0`, i.e. `posix_fadvise(DONTNEED)`). Only clean
/// pages go, so the files must have been fsynced (engines closed).
pub fn drop_page_cache(dir: &Path) -> Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path)? {
            let entry = entry?;
            if entry.metadata()?.is_dir() {
                stack.push(entry.path());
                continue;
            }
            let status = Command::new("dd")
                .arg(format!("if={}", entry.path().display()))
                .args(["iflag=nocache", "count=0", "status=none"])
                .status()
                .context("running dd")?;
            if !status.success() {
                bail!("dd could not drop the cache of {}", entry.path().display());
            }
        }
    }
    Ok(())
}

/// Resident set size of this process in bytes (`VmRSS` of /proc/self/status).
pub fn rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("empty VmRSS line")?
        .parse()?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_nested_files() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("sub"))?;
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000])?;
        std::fs::write(dir.path().join("sub/b"), vec![1u8; 10_000])?;
        assert!(disk_usage(dir.path())? >= 20_000);
        drop_page_cache(dir.path())?;
        assert!(rss_bytes()? > 0);
        Ok(())
    }
}
