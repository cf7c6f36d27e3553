//! Opening what a scan reads without ever waiting on it. A FIFO named `x.gguf` or
//! `config.json` blocks `open` until a writer comes (for ever), a socket or a device
//! misbehaves the same way; none of them is a model file. So the scan skips what is not a
//! regular file or directory (`metadata`, which follows links, never opens), and opens with
//! `O_NONBLOCK`, then checks the opened file again: one swapped in between the two is
//! refused instead of blocking. (A hung network mount blocks even `stat`; that is why
//! scans run on their own thread, see `Library`.)
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most a JSON file of a model folder (config, tokenizer config, shard index) may
/// weigh: the real ones are KBs to a few MB.
pub const MAX_JSON_BYTES: u64 = 32 << 20;

/// Something that exists but is no regular file: a FIFO, socket, device (links followed).
/// A dangling link is not special: it is a missing file, which the scan reports.
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `path` opened for reading, never blocking on the open; Err for anything but a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // On a regular file O_NONBLOCK changes nothing; on a FIFO it makes the open return at once.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file (a FIFO, socket or device)"));
    }
    Ok(file)
}

/// A small text file (at most [`MAX_JSON_BYTES`]), read without blocking on what is not a file.
pub fn read_text(path: &Path) -> io::Result<String> {
    let file = open_regular(path)?;
    if file.metadata()?.len() > MAX_JSON_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("larger than {} MB", MAX_JSON_BYTES >> 20)));
    }
    let mut text = String::new();
    file.take(MAX_JSON_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.json");
        mkfifo(&fifo);
        assert!(is_special(&fifo));
        // Without O_NONBLOCK this open would wait for a writer for ever.
        let err = read_text(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let link = dir.path().join("link.gguf");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(is_special(&link) && open_regular(&link).is_err(), "a link to a FIFO is one");

        let file = dir.path().join("tokenizer_config.json");
        std::fs::write(&file, "{}").unwrap();
        assert!(!is_special(&file) && !is_special(&dir.path().join("gone.gguf")));
        assert_eq!(read_text(&file).unwrap(), "{}");
    }
}
