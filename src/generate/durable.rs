//! Files that are replaced whole or not at all, and that survive a crash once written.
//!
//! [`AtomicWrite::create`] opens a temporary file beside the target (`.NAME.tmp.<pid>.<n>`, in
//! the same directory so that the rename below never crosses file systems);
//! [`AtomicFile::commit_with`] streams the content into it, `fsync`s it, renames it over the
//! target and (on unix) `fsync`s the directory, so that the rename itself is on disk. Until the
//! rename, the old file (if any) is untouched; any failure before it removes the temporary file,
//! and so does dropping an [`AtomicFile`] that was never committed. A reader therefore sees
//! either the old file or the complete new one — never a prefix of it. Only a process killed
//! between creating and committing leaves its temporary file behind (under a name no reader
//! opens).
//!
//! Opening the temporary file is a separate step so that a caller can fail before doing
//! expensive work whose result could not be saved (`MINFER_TRACE` checks the trace's directory
//! before the run computes anything).
//!
//! The rename replaces the directory entry: a target that is a symbolic link is replaced by a
//! regular file, not written through.
//!
//! [`AtomicWrite::fail_after_bytes`] is the fault-injection seam for tests: the write fails (as
//! on a full disk) once that many bytes reached the file. It is a field of the value a caller
//! passes, not global state, so tests running in parallel do not see each other's faults.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a durable write failed. Every variant names the target; the old file is intact unless
/// the variant is [`DurableError::SyncDir`] (the new file is in place, but a crash may still
/// lose the rename).
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("{}: cannot create the temporary file {}: {source}", path.display(), tmp.display())]
    CreateTemp { path: PathBuf, tmp: PathBuf, source: io::Error },
    #[error("{}: writing failed: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("{}: flushing to disk (fsync) failed: {source}", path.display())]
    Sync { path: PathBuf, source: io::Error },
    #[error("{}: cannot rename the temporary file {} over it: {source}", path.display(), tmp.display())]
    Rename { path: PathBuf, tmp: PathBuf, source: io::Error },
    #[error("{}: written, but flushing its directory {} to disk (fsync) failed: {source}", path.display(), dir.display())]
    SyncDir { path: PathBuf, dir: PathBuf, source: io::Error },
}

impl DurableError {
    /// The file that was to be written.
    pub fn path(&self) -> &Path {
        match self {
            DurableError::CreateTemp { path, .. }
            | DurableError::Write { path, .. }
            | DurableError::Sync { path, .. }
            | DurableError::Rename { path, .. }
            | DurableError::SyncDir { path, .. } => path,
        }
    }

    /// The underlying I/O error.
    pub fn io_error(&self) -> &io::Error {
        match self {
            DurableError::CreateTemp { source, .. }
            | DurableError::Write { source, .. }
            | DurableError::Sync { source, .. }
            | DurableError::Rename { source, .. }
            | DurableError::SyncDir { source, .. } => source,
        }
    }
}

/// How to write a file atomically and durably; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AtomicWrite {
    /// Tests only: writing fails once this many bytes reached the temporary file (the bytes
    /// before are written, as a full disk does). `None` (the default): no injected failure.
    pub fail_after_bytes: Option<u64>,
}

/// Distinguishes temporary files of one process (the pid distinguishes processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Attempts at a fresh temporary name before giving up (a name is only taken by a leftover of
/// an earlier process with the same pid).
const TEMP_ATTEMPTS: u32 = 16;

impl AtomicWrite {
    /// Opens a fresh temporary file beside `path`; nothing under `path` changes until
    /// [`AtomicFile::commit_with`]. Fails when the directory does not exist or is not writable.
    pub fn create(&self, path: &Path) -> Result<AtomicFile, DurableError> {
        let dir = parent_dir(path);
        let name = path.file_name().map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
        let mut attempt = 0;
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let tmp = dir.join(format!(".{name}.tmp.{}.{n}", std::process::id()));
            // create_new: never truncate a file that is someone else's.
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => {
                    let budget = self.fail_after_bytes;
                    let out = BufWriter::new(Budget { file, written: 0, budget });
                    return Ok(AtomicFile { target: path.to_path_buf(), tmp, out: Some(out) });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt + 1 < TEMP_ATTEMPTS => attempt += 1,
                Err(source) => return Err(DurableError::CreateTemp { path: path.to_path_buf(), tmp, source }),
            }
        }
    }

    /// [`create`](Self::create), then [`AtomicFile::commit_with`].
    pub fn write(&self, path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), DurableError> {
        self.create(path)?.commit_with(write)
    }
}

/// Writes `path` atomically and durably with the content `write` produces (module docs).
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), DurableError> {
    AtomicWrite::default().write(path, write)
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A temporary file that becomes its target on [`commit_with`](Self::commit_with); dropped
/// uncommitted, it is removed.
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    /// `None` once committed (or while committing): nothing left to remove.
    out: Option<BufWriter<Budget>>,
}

impl AtomicFile {
    /// The file this one replaces when committed.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Where the content is written until the rename.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// Writes the content (`write` streams it; its error fails the whole write), flushes and
    /// `fsync`s it, renames it over the target and `fsync`s the directory. On an error before
    /// the rename the temporary file is removed and the target is as it was.
    pub fn commit_with(mut self, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), DurableError> {
        let target = self.target.clone();
        let Some(out) = self.out.take() else {
            // Only commit_with takes `out`, and it consumes self.
            return Err(DurableError::Write { path: target, source: io::Error::other("already committed") });
        };
        // The file is closed when this returns, before the rename or the removal.
        if let Err(e) = write_and_sync(out, &target, write) {
            self.remove_temp();
            return Err(e);
        }
        if let Err(source) = std::fs::rename(&self.tmp, &target) {
            self.remove_temp();
            return Err(DurableError::Rename { path: target, tmp: self.tmp.clone(), source });
        }
        sync_dir(&parent_dir(&target)).map_err(|(dir, source)| DurableError::SyncDir { path: target, dir, source })
    }

    /// Removes the temporary file. A failure is not reported: the caller is already
    /// reporting the error that made the write fail, and a leftover under the temporary name is
    /// never read.
    fn remove_temp(&self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            // Closed before removal (Windows cannot remove an open file); unflushed bytes are
            // thrown away with the file.
            drop(out.into_parts());
            self.remove_temp();
        }
    }
}

/// Streams the content into `out`, flushes it and `fsync`s the file (`target` names it in
/// errors).
fn write_and_sync(
    mut out: BufWriter<Budget>,
    target: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), DurableError> {
    let err = |source| DurableError::Write { path: target.to_path_buf(), source };
    write(&mut out).map_err(err)?;
    let file = out.into_inner().map_err(|e| err(e.into_error()))?.file;
    file.sync_all().map_err(|source| DurableError::Sync { path: target.to_path_buf(), source })
}

/// `fsync`s a directory, so that a rename in it is on disk. Unix only: elsewhere a directory
/// cannot be opened as a file, and the rename is as durable as the platform makes it.
fn sync_dir(dir: &Path) -> Result<(), (PathBuf, io::Error)> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| (dir.to_path_buf(), e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// The temporary file, failing like a full disk after [`AtomicWrite::fail_after_bytes`].
#[derive(Debug)]
struct Budget {
    file: File,
    written: u64,
    budget: Option<u64>,
}

impl Write for Budget {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let allowed = match self.budget {
            None => buf.len(),
            Some(b) => {
                let left = b.saturating_sub(self.written);
                if left == 0 && !buf.is_empty() {
                    return Err(io::Error::new(io::ErrorKind::StorageFull, format!("injected failure after {b} bytes")));
                }
                buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))
            }
        };
        let n = self.file.write(&buf[..allowed])?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty directory under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("minfer-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn put(bytes: &[u8]) -> impl FnOnce(&mut dyn Write) -> io::Result<()> + '_ {
        move |w| w.write_all(bytes)
    }

    #[test]
    fn writes_replaces_and_leaves_nothing_else() {
        let d = scratch("replace");
        let p = d.join("f.bin");
        write_atomic(&p, put(b"first")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        write_atomic(&p, put(b"second, longer")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second, longer");
        assert_eq!(entries(&d), ["f.bin"]);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn injected_failures_keep_the_old_file_at_every_offset() {
        let d = scratch("inject");
        let p = d.join("f.bin");
        write_atomic(&p, put(b"old")).unwrap();
        // 20 000 bytes: more than BufWriter's 8 KiB buffer, so failures arrive both from
        // write_all and from the final flush.
        let new: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        for at in [0, 1, 8191, 8192, 10_000, 19_999] {
            let e = AtomicWrite { fail_after_bytes: Some(at) }.write(&p, put(&new)).unwrap_err();
            assert!(matches!(&e, DurableError::Write { path, .. } if path == &p), "{at}: {e:?}");
            assert_eq!(e.io_error().kind(), io::ErrorKind::StorageFull, "{at}");
            assert!(e.to_string().starts_with(&format!("{}: writing failed", p.display())), "{e}");
            assert_eq!(std::fs::read(&p).unwrap(), b"old", "{at}");
            assert_eq!(entries(&d), ["f.bin"], "{at}");
        }
        // Exactly the content's length is enough: the seam counts bytes exactly.
        AtomicWrite { fail_after_bytes: Some(new.len() as u64) }.write(&p, put(&new)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), new);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn the_closures_error_fails_the_write() {
        let d = scratch("closure");
        let p = d.join("f.bin");
        let e = write_atomic(&p, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("generator gave up"))
        })
        .unwrap_err();
        assert!(matches!(e, DurableError::Write { .. }), "{e:?}");
        assert!(!p.exists());
        assert_eq!(entries(&d), Vec::<String>::new());
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn the_temporary_file_exists_from_create_until_commit_or_drop() {
        let d = scratch("early");
        let p = d.join("t.json");
        let f = AtomicWrite::default().create(&p).unwrap();
        let tmp_name = f.temp_path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(tmp_name.starts_with(".t.json.tmp."), "{tmp_name}");
        assert_eq!(entries(&d), [tmp_name.clone()]);
        drop(f);
        assert_eq!(entries(&d), Vec::<String>::new());
        let f = AtomicWrite::default().create(&p).unwrap();
        let g = AtomicWrite::default().create(&p).unwrap();
        assert_ne!(f.temp_path(), g.temp_path());
        g.commit_with(put(b"g")).unwrap();
        f.commit_with(put(b"f")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"f");
        assert_eq!(entries(&d), ["t.json"]);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_missing_directory_fails_at_create_naming_the_path() {
        let p = Path::new("/nonexistent-minfer-dir/t.json");
        let e = AtomicWrite::default().create(p).unwrap_err();
        assert!(matches!(&e, DurableError::CreateTemp { .. }), "{e:?}");
        assert_eq!(e.path(), p);
        assert_eq!(e.io_error().kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().starts_with("/nonexistent-minfer-dir/t.json: cannot create the temporary file"), "{e}");
    }

    #[test]
    fn a_failed_rename_removes_the_temporary_file() {
        // A non-empty directory cannot be replaced by a file.
        let d = scratch("rename");
        let p = d.join("taken");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("inside"), b"x").unwrap();
        let e = write_atomic(&p, put(b"data")).unwrap_err();
        assert!(matches!(e, DurableError::Rename { .. }), "{e:?}");
        assert_eq!(entries(&d), ["taken"]);
        assert_eq!(std::fs::read(p.join("inside")).unwrap(), b"x");
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("x.json")), PathBuf::from("."));
        assert_eq!(parent_dir(Path::new("a/x.json")), PathBuf::from("a"));
    }
}
