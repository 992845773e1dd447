//! Per-proc log files, written by the host that captures the procs' pipes.
//!
//! Each proc gets one file holding everything it wrote to stdout and stderr, byte for
//! byte, in the order the host read it: `<dir>/<mesh>-<rank>-<pid>.log`, where `rank` is
//! the proc's rank in its proc mesh. The default directory is a per-user folder under
//! the temporary directory, [`default_dir`]: `$TMPDIR/monarch-<user>/logs` (`/tmp` when
//! `TMPDIR` is unset). The host creates it (mode 0700) and writes there only if it
//! belongs to the host's user; files older than [`KEEP_FOR`] are removed when a host
//! first uses the directory.
//!
//! ```
//! use hyperactor_mesh::output::files;
//!
//! let name = files::file_name("trainers", 3, 4242);
//! assert_eq!(name, "trainers-3-4242.log");
//! assert!(files::default_dir().ends_with("logs"));
//! ```

use hyperactor::sync::Mutex;
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// How long log files are kept: older ones are removed when a host first writes to
/// their directory.
pub const KEEP_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default directory of the per-proc log files: `$TMPDIR/monarch-<user>/logs`.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir()
        .join(format!("monarch-{}", user()))
        .join("logs")
}

/// This process's user name (`$USER`, `$LOGNAME`, else the numeric uid), made safe
/// for a file name.
fn user() -> String {
    let name = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let name = sanitize(&name);
    if name.is_empty() {
        // SAFETY: getuid has no preconditions and cannot fail.
        return unsafe { libc::getuid() }.to_string();
    }
    name
}

/// `text` with every character but ASCII letters, digits, `-`, `_` and `.` replaced by
/// `_` (and no leading `.`).
fn sanitize(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    clean.trim_start_matches('.').to_string()
}

/// The file name of the log of rank `rank` (pid `pid`) of proc mesh `mesh`.
pub fn file_name(mesh: &str, rank: usize, pid: u32) -> String {
    format!("{}-{rank}-{pid}.log", sanitize(mesh))
}

/// Opens (creating) the log file of a proc in `dir`.
///
/// # Errors
///
/// When `dir` cannot be created, belongs to another user or is writable by others, or
/// the file cannot be created.
pub fn create(dir: &Path, mesh: &str, rank: usize, pid: u32) -> io::Result<(PathBuf, File)> {
    prepare(dir)?;
    let path = dir.join(file_name(mesh, rank, pid));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)?;
    Ok((path, file))
}

/// Creates `dir` (and its parent) with mode 0700 if needed, checks that both belong to
/// this user and are not writable by others, and prunes old files — once per
/// directory per process.
fn prepare(dir: &Path) -> io::Result<()> {
    static READY: OnceLock<Mutex<Vec<PathBuf>>> = OnceLock::new();
    let ready = READY.get_or_init(Mutex::default);
    let mut ready = ready.lock();
    if ready.iter().any(|d| d == dir) {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut checked: Vec<&Path> = vec![dir];
    checked.extend(dir.parent().filter(|p| p.file_name().is_some()));
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    for path in checked {
        let meta = std::fs::symlink_metadata(path)?;
        // The parent may be a shared directory (`/tmp` for a custom `dir`); only ours
        // must be private.
        let ours = meta.uid() == uid;
        if path == dir && (!meta.is_dir() || !ours || meta.mode() & 0o022 != 0) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "log directory {} is not a directory of this user (uid {uid}) closed to \
                     others; remove it, or choose another with the proc_log_dir config key",
                    path.display()
                ),
            ));
        }
    }
    prune(dir, KEEP_FOR);
    ready.push(dir.to_path_buf());
    Ok(())
}

/// Removes the `.log` files of `dir` last written more than `age` ago.
fn prune(dir: &Path, age: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|elapsed| elapsed > age);
        if old {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn names_are_safe_file_names() {
        assert_eq!(file_name("a/b c", 0, 1), "a_b_c-0-1.log");
        assert_eq!(file_name("..x", 2, 3), "x-2-3.log");
        assert!(!user().is_empty());
    }

    #[test]
    fn create_makes_a_private_directory_and_appends() {
        let base = std::env::temp_dir().join(format!("monarch-files-test-{}", std::process::id()));
        let dir = base.join("logs");
        let (path, mut file) = create(&dir, "m", 1, 2).unwrap();
        file.write_all(b"one\n").unwrap();
        let (_, mut again) = create(&dir, "m", 1, 2).unwrap();
        again.write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let dir = std::env::temp_dir().join(format!("monarch-files-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let err = create(&dir, "m", 0, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn prune_removes_only_old_log_files() {
        let dir = std::env::temp_dir().join(format!("monarch-files-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["old.log", "new.log", "old.txt"] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        for name in ["old.log", "old.txt"] {
            File::options()
                .write(true)
                .open(dir.join(name))
                .unwrap()
                .set_modified(two_hours_ago)
                .unwrap();
        }
        prune(&dir, Duration::from_secs(3600));
        assert!(!dir.join("old.log").exists());
        assert!(dir.join("new.log").exists());
        assert!(dir.join("old.txt").exists(), "only log files are pruned");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
