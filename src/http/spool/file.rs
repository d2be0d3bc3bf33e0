//! The file a spool spills to: the bytes that left its memory window while
//! a reader still needs them.
//!
//! It is a ring of `cap` bytes: body byte `pos` lives at offset
//! `pos % cap`, so the file never grows past `cap`, and a byte is written
//! over only once the body is `cap` bytes further on (the spool cuts off
//! every reader that still needs it before). The file is unlinked as soon
//! as it is created: nothing is left on disk once its last handle closes,
//! whatever way the process ends. Its calls block: the spool makes them on
//! tokio's blocking threads.

use std::fs::File;
use std::io;
use std::path::Path;

use bytes::Bytes;

pub(crate) struct SpillFile {
    file: File,
    cap: u64,
}

impl SpillFile {
    /// A new, already unlinked, file of at most `cap` bytes in `dir`.
    #[cfg(unix)]
    pub(crate) fn create(dir: &Path, cap: u64) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::sync::atomic::{AtomicU64, Ordering};

        static NEXT: AtomicU64 = AtomicU64::new(0);
        if cap == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no room"));
        }
        let mut last = io::Error::other("no free name");
        for _ in 0..8 {
            let name = format!(
                ".stampede-guard-spill-{}-{}-{:016x}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed),
                crate::random::unguessable_u64()
            );
            let path = dir.join(name);
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    // Unlinked at once: the open handle keeps it while it
                    // is needed, and nothing outlives the process.
                    std::fs::remove_file(&path)?;
                    return Ok(SpillFile { file, cap });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Spilling needs positional reads and a file that can be unlinked
    /// while open: elsewhere the spool keeps to its memory window.
    #[cfg(not(unix))]
    pub(crate) fn create(_dir: &Path, _cap: u64) -> io::Result<Self> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "spilling to disk needs a Unix file system",
        ))
    }

    /// The ring's pieces that hold body bytes `[pos, pos + len)`: their
    /// offsets in the file and lengths.
    fn pieces(&self, pos: u64, len: u64) -> impl Iterator<Item = (u64, usize)> {
        let cap = self.cap;
        let at = pos % cap;
        let first = len.min(cap - at);
        [(at, first), (0, len - first)]
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(at, n)| (at, n as usize))
    }

    /// The file's size on disk.
    #[cfg(test)]
    pub(crate) fn size(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }

    /// Writes `chunks`, body bytes from `pos` on. Of more than the ring
    /// holds, only the last `cap` bytes are written (nobody may read the
    /// rest).
    pub(crate) fn write(&self, mut pos: u64, chunks: &[Bytes]) -> io::Result<()> {
        let total: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let mut skip = total.saturating_sub(self.cap);
        for chunk in chunks {
            let mut chunk = &chunk[..];
            let drop = skip.min(chunk.len() as u64) as usize;
            chunk = &chunk[drop..];
            skip -= drop as u64;
            pos += drop as u64;
            let mut done = 0;
            for (at, n) in self.pieces(pos, chunk.len() as u64) {
                write_at(&self.file, &chunk[done..done + n], at)?;
                done += n;
            }
            pos += chunk.len() as u64;
        }
        Ok(())
    }

    /// Reads body bytes `[pos, pos + len)` (`len` at most the ring's size).
    pub(crate) fn read(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let len = (len as u64).min(self.cap);
        let mut buf = vec![0; len as usize];
        let mut done = 0;
        for (at, n) in self.pieces(pos, len) {
            read_at(&self.file, &mut buf[done..done + n], at)?;
            done += n;
        }
        Ok(Bytes::from(buf))
    }
}

#[cfg(unix)]
fn write_at(file: &File, buf: &[u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, at)
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(not(unix))]
fn write_at(_: &File, _: &[u8], _: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

#[cfg(not(unix))]
fn read_at(_: &File, _: &mut [u8], _: u64) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}
