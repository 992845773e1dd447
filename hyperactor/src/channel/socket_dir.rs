//! The per-user directory of Unix socket files, and their cleanup.
//!
//! [`ChannelAddr::any`](super::ChannelAddr::any) puts Unix sockets into
//! [`socket_dir`]: `$XDG_RUNTIME_DIR/hyperactor` when `XDG_RUNTIME_DIR` is
//! set to a directory this user owns, else `<temp dir>/hyperactor-<uid>`
//! (`/tmp/hyperactor-1000`). Other users cannot open it, so they cannot
//! connect to this user's procs nor replace their socket files.
//!
//! Invariants:
//! - before a socket is bound in it, the directory is created with mode
//!   0700, or, if it exists, checked to be a real directory (not a symbolic
//!   link) owned by this user with no access for group or others; otherwise
//!   serving fails with [`ChannelError::SocketDir`], which names the
//!   directory and says how to fix it;
//! - socket paths stay well under the 108-byte limit of Unix socket
//!   addresses: a directory longer than [`MAX_SOCKET_DIR_LEN`] bytes is
//!   passed over for `/tmp/hyperactor-<uid>`;
//! - every socket file this process serves is removed when its server is
//!   dropped, or earlier by [`remove_socket_files`] (for exit hooks), and
//!   each file is removed at most once, so a path that another process
//!   bound again meanwhile is left alone;
//! - files left behind by processes that could not remove them (killed,
//!   crashed) are swept once per process, in the background, when it first
//!   serves in the directory: a file named as `ChannelAddr::any` names it
//!   (`<pid>-<n>-<hex>.sock`) is removed only if its process is gone and
//!   nothing listens on it.
//!
//! ```
//! use hyperactor::channel::{socket_dir, ChannelAddr, ChannelTransport};
//! let ChannelAddr::Unix(path) = ChannelAddr::any(ChannelTransport::Unix) else {
//!     unreachable!()
//! };
//! assert_eq!(path.parent(), Some(socket_dir()));
//! assert!(path.as_os_str().len() < 108);
//! ```

use crate::sync::Mutex;
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::LazyLock;

use std::sync::OnceLock;

use super::error::ChannelError;

/// The longest socket directory [`socket_dir`] picks, in bytes, leaving room
/// for a file name within the 108-byte limit of Unix socket addresses.
pub const MAX_SOCKET_DIR_LEN: usize = 64;

/// The directory where [`ChannelAddr::any`](super::ChannelAddr::any) puts
/// Unix sockets: `$XDG_RUNTIME_DIR/hyperactor` when `XDG_RUNTIME_DIR` is set
/// to a directory this user owns, else `<temp dir>/hyperactor-<uid>` (such as
/// `/tmp/hyperactor-1000`); a choice longer than [`MAX_SOCKET_DIR_LEN`]
/// bytes is passed over for `/tmp/hyperactor-<uid>`. Chosen once per
/// process.
///
/// Serving a socket in it first creates it with mode 0700, or, if it
/// exists, checks that it is a directory (not a symbolic link) owned by
/// this user with no access for group or others; serving fails with
/// [`ChannelError::SocketDir`] otherwise.
/// The first socket a process serves there also starts a sweep of the
/// files that killed or crashed processes left behind (their process is
/// gone and nothing listens on them).
pub fn socket_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        pick_socket_dir(
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            std::env::temp_dir(),
            current_uid(),
        )
    })
}

/// The effective user id of this process.
pub(crate) fn current_uid() -> u32 {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The socket directory for a process of user `uid` whose `XDG_RUNTIME_DIR`
/// is `runtime_dir` and whose temporary directory is `temp_dir`.
pub(crate) fn pick_socket_dir(
    runtime_dir: Option<PathBuf>,
    temp_dir: PathBuf,
    uid: u32,
) -> PathBuf {
    let owned_dir =
        |dir: &Path| std::fs::metadata(dir).is_ok_and(|meta| meta.is_dir() && meta.uid() == uid);
    let candidates = runtime_dir
        .filter(|dir| dir.is_absolute() && owned_dir(dir))
        .map(|dir| dir.join("hyperactor"))
        .into_iter()
        .chain([temp_dir.join(format!("hyperactor-{uid}"))]);
    for dir in candidates {
        if dir.as_os_str().len() <= MAX_SOCKET_DIR_LEN {
            return dir;
        }
    }
    PathBuf::from(format!("/tmp/hyperactor-{uid}"))
}

/// Creates `dir` with mode 0700 if it does not exist, then checks that it is
/// private to user `uid` (see the [module docs](self)). Its parent must
/// exist.
///
/// # Errors
/// [`ChannelError::SocketDir`] if it cannot be created, or is a symbolic
/// link, not a directory, owned by another user, or open to group or others.
pub(crate) fn ensure_private_dir(dir: &Path, uid: u32) -> Result<(), ChannelError> {
    let error = |problem: String, fix: &'static str| ChannelError::SocketDir {
        path: dir.to_path_buf(),
        problem,
        fix,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => {
            return Err(error(
                format!("it cannot be created: {err}"),
                "make its parent directory writable, or point XDG_RUNTIME_DIR or TMPDIR \
                 at a directory of your own",
            ))
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|err| {
        error(
            format!("it cannot be inspected: {err}"),
            "remove it, or point XDG_RUNTIME_DIR or TMPDIR at a directory of your own",
        )
    })?;
    let remove = "remove it (it is recreated), or point XDG_RUNTIME_DIR or TMPDIR at a \
                  directory of your own";
    if meta.file_type().is_symlink() {
        return Err(error("it is a symbolic link".to_string(), remove));
    }
    if !meta.is_dir() {
        return Err(error("it is not a directory".to_string(), remove));
    }
    if meta.uid() != uid {
        return Err(error(
            format!(
                "it is owned by uid {}, not by this user (uid {uid})",
                meta.uid()
            ),
            remove,
        ));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 || mode & 0o700 != 0o700 {
        return Err(error(
            format!("its mode is {mode:04o}, expected 0700 (only its owner may use it)"),
            "run `chmod 700` on it, or remove it (it is recreated)",
        ));
    }
    Ok(())
}

/// Prepares `dir`, the socket directory, for a socket: creates or checks it
/// ([`ensure_private_dir`]), and, the first time in this process, starts
/// sweeping the files left behind in it ([`sweep_stale`]) on a blocking
/// thread of the current runtime.
///
/// # Errors
/// As [`ensure_private_dir`].
pub(crate) fn prepare(dir: &'static Path) -> Result<(), ChannelError> {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    ensure_private_dir(dir, current_uid())?;
    SWEPT.call_once(|| {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                let removed = sweep_stale(dir);
                if removed > 0 {
                    tracing::debug!(dir = %dir.display(), removed, "removed stale socket files");
                }
            });
        }
    });
    Ok(())
}

/// Removes the socket files in `dir` that processes of this user left
/// behind when they died without removing them: files named as
/// `ChannelAddr::any` names them (`<pid>-<n>-<hex>.sock`) whose process is
/// gone and on which nothing listens (a connection is refused). Returns how
/// many it removed.
pub(crate) fn sweep_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some(pid) = socket_file_pid(&entry.file_name()) else {
            continue;
        };
        if process_exists(pid) || !entry.file_type().is_ok_and(|t| t.is_socket()) {
            continue;
        }
        let path = entry.path();
        let refused = matches!(
            std::os::unix::net::UnixStream::connect(&path),
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused
        );
        if refused && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The pid in a socket file name made by `ChannelAddr::any`
/// (`<pid>-<n>-<hex>.sock`); `None` for any other name.
fn socket_file_pid(name: &std::ffi::OsStr) -> Option<u32> {
    let stem = name.to_str()?.strip_suffix(".sock")?;
    let mut fields = stem.split('-');
    let (pid, n, nanos) = (fields.next()?, fields.next()?, fields.next()?);
    let digits = |s: &str, hex: bool| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (hex && matches!(b, b'a'..=b'f')))
    };
    if fields.next().is_some() || !digits(n, false) || !digits(nanos, true) || !digits(pid, false) {
        return None;
    }
    pid.parse().ok()
}

/// Whether a process `pid` exists (in doubt: yes).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 sends nothing; `kill` only checks that `pid` exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Socket files served and not removed yet, each with the token of the
/// server that bound it.
#[derive(Debug, Default)]
pub(crate) struct Served(Mutex<ServedFiles>);

#[derive(Debug, Default)]
struct ServedFiles {
    next_token: u64,
    files: HashMap<PathBuf, u64>,
}

/// The socket files this process serves.
pub(crate) static SERVED: LazyLock<Served> = LazyLock::new(Served::default);

impl Served {
    fn lock(&self) -> crate::sync::MutexGuard<'_, ServedFiles> {
        self.0.lock()
    }

    /// Records that a socket is served at `path`; returns the token that
    /// [`Served::remove`] takes.
    pub(crate) fn register(&self, path: &Path) -> u64 {
        let mut served = self.lock();
        served.next_token += 1;
        let token = served.next_token;
        served.files.insert(path.to_path_buf(), token);
        token
    }

    /// Removes the socket file at `path` that `register` returned `token`
    /// for, unless it was removed already (by [`Served::remove_all`], after
    /// which another server may have bound the path again).
    pub(crate) fn remove(&self, path: &Path, token: u64) {
        let mut served = self.lock();
        if served.files.get(path) == Some(&token) {
            served.files.remove(path);
            remove_file(path);
        }
    }

    /// Removes every recorded socket file; returns how many.
    pub(crate) fn remove_all(&self) -> usize {
        let mut served = self.lock();
        let count = served.files.len();
        for (path, _) in served.files.drain() {
            remove_file(&path);
        }
        count
    }
}

fn remove_file(path: &Path) {
    if let Err(err) = std::fs::remove_file(path) {
        tracing::debug!(path = %path.display(), %err, "failed to remove socket file");
    }
}

/// Removes the socket file of every Unix endpoint this process serves, and
/// returns how many it removed. For exit hooks: a process that exits
/// without stopping its procs leaves no socket file behind.
///
/// The endpoints go on serving the connections they have, but nobody can
/// connect to them any more. Dropping their servers later removes nothing
/// (so a path bound again by another process meanwhile is left alone).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use hyperactor::channel::{remove_socket_files, serve, ChannelAddr, ChannelTransport};
/// let rx = serve(&ChannelAddr::any(ChannelTransport::Unix)).await.unwrap();
/// let ChannelAddr::Unix(path) = rx.addr().clone() else { unreachable!() };
/// assert!(remove_socket_files() >= 1);
/// assert!(!path.exists());
/// # }
/// ```
pub fn remove_socket_files() -> usize {
    SERVED.remove_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A fresh empty directory for one test, removed at the end.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "hyperactor-test-{name}-{}-{:x}",
                std::process::id(),
                nanos()
            ));
            std::fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn nanos() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn creates_a_private_directory() {
        let scratch = Scratch::new("create");
        let dir = scratch.0.join("hyperactor-42");
        ensure_private_dir(&dir, current_uid()).unwrap();
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.uid(), current_uid());
        assert_eq!(mode(&dir), 0o700);
        // An existing good directory is accepted as it is.
        ensure_private_dir(&dir, current_uid()).unwrap();
    }

    #[test]
    fn the_real_socket_dir_is_private() {
        let dir = socket_dir();
        assert!(dir.as_os_str().len() <= MAX_SOCKET_DIR_LEN, "{dir:?}");
        ensure_private_dir(dir, current_uid()).unwrap();
        let meta = std::fs::symlink_metadata(dir).unwrap();
        assert_eq!(meta.uid(), current_uid());
        assert_eq!(mode(dir), 0o700);
    }

    fn refused(dir: &Path, uid: u32) -> (String, PathBuf) {
        match ensure_private_dir(dir, uid).unwrap_err() {
            err @ ChannelError::SocketDir { .. } => {
                let ChannelError::SocketDir { ref path, .. } = err else {
                    unreachable!()
                };
                (err.to_string(), path.clone())
            }
            err => panic!("not a SocketDir error: {err}"),
        }
    }

    #[test]
    fn open_permissions_are_refused() {
        let scratch = Scratch::new("perms");
        let dir = scratch.0.join("open");
        std::fs::create_dir(&dir).unwrap();
        for bad in [0o755, 0o770, 0o701, 0o500] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(bad)).unwrap();
            let (msg, path) = refused(&dir, current_uid());
            assert_eq!(path, dir);
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("{bad:04o}")), "{msg}");
            assert!(msg.contains("chmod 700"), "{msg}");
        }
        // Left as it was: the check never changes permissions.
        assert_eq!(mode(&dir), 0o500);
    }

    #[test]
    fn symlinks_files_and_other_owners_are_refused() {
        let scratch = Scratch::new("kinds");
        let target = scratch.0.join("target");
        ensure_private_dir(&target, current_uid()).unwrap();
        let link = scratch.0.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let (msg, path) = refused(&link, current_uid());
        assert_eq!(path, link);
        assert!(
            msg.contains("symbolic link") && msg.contains("remove it"),
            "{msg}"
        );

        let file = scratch.0.join("file");
        std::fs::write(&file, b"").unwrap();
        let (msg, _) = refused(&file, current_uid());
        assert!(msg.contains("not a directory"), "{msg}");

        // A directory owned by someone else: checked as another uid would.
        let other = current_uid().wrapping_add(1);
        let (msg, _) = refused(&target, other);
        assert!(
            msg.contains(&format!("owned by uid {}", current_uid()))
                && msg.contains(&format!("uid {other}")),
            "{msg}"
        );

        // A parent that does not exist: cannot be created.
        let (msg, _) = refused(&scratch.0.join("missing/sub"), current_uid());
        assert!(msg.contains("cannot be created"), "{msg}");
    }

    #[test]
    fn picks_the_runtime_dir_only_when_owned_and_short() {
        let scratch = Scratch::new("pick");
        let uid = current_uid();
        let tmp = PathBuf::from("/some/tmp");
        let fallback = PathBuf::from(format!("/some/tmp/hyperactor-{uid}"));
        assert_eq!(pick_socket_dir(None, tmp.clone(), uid), fallback);
        assert_eq!(
            pick_socket_dir(Some(scratch.0.clone()), tmp.clone(), uid),
            scratch.0.join("hyperactor")
        );
        // Not ours, missing, or relative: not used.
        let other = uid.wrapping_add(1);
        assert_eq!(
            pick_socket_dir(Some(scratch.0.clone()), tmp.clone(), other),
            PathBuf::from(format!("/some/tmp/hyperactor-{other}"))
        );
        let missing = scratch.0.join("missing");
        assert_eq!(pick_socket_dir(Some(missing), tmp.clone(), uid), fallback);
        assert_eq!(pick_socket_dir(Some("rel".into()), tmp, uid), fallback);
        // Too long for socket paths: /tmp.
        let long = PathBuf::from(format!("/{}", "x".repeat(MAX_SOCKET_DIR_LEN)));
        assert_eq!(
            pick_socket_dir(None, long, uid),
            PathBuf::from(format!("/tmp/hyperactor-{uid}"))
        );
    }

    #[test]
    fn sweeping_removes_only_files_of_dead_processes_nobody_listens_on() {
        use std::os::unix::net::UnixListener;
        let scratch = Scratch::new("sweep");
        // A pid that no process has any more: a child that exited and was reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let at = |name: String| scratch.0.join(name);
        // Bound, then closed: std's listener does not remove its file.
        let stale = at(format!("{dead}-0-1f.sock"));
        drop(UnixListener::bind(&stale).unwrap());
        // Dead process, but something still listens (an inherited socket).
        let listened = at(format!("{dead}-1-2e.sock"));
        let _listener = UnixListener::bind(&listened).unwrap();
        // A live process's socket, even with nobody listening.
        let alive = at(format!("{live}-0-3d.sock"));
        drop(UnixListener::bind(&alive).unwrap());
        // Names not made by `ChannelAddr::any`, and a plain file.
        let foreign = at(format!("x{dead}-0-4c.sock"));
        drop(UnixListener::bind(&foreign).unwrap());
        let plain = at(format!("{dead}-2-5b.sock"));
        std::fs::write(&plain, b"").unwrap();

        assert_eq!(sweep_stale(&scratch.0), 1);
        assert!(!stale.exists());
        for kept in [&listened, &alive, &foreign, &plain] {
            assert!(kept.exists(), "{kept:?} was removed");
        }
        assert_eq!(sweep_stale(&scratch.0.join("missing")), 0);
    }

    #[test]
    fn socket_file_names() {
        use std::ffi::OsStr;
        let pid = |s: &str| socket_file_pid(OsStr::new(s));
        assert_eq!(pid("123-0-1a2b.sock"), Some(123));
        assert_eq!(pid("4194304-17-ffffffff.sock"), Some(4194304));
        for other in [
            "123-0-1a2b",
            "123-0.sock",
            "123-0-1a2b-9.sock",
            "-0-1a.sock",
            "12a-0-1a.sock",
            "123-x-1a.sock",
            "123-0-1G.sock",
            "hyperactor-123-0-1a.sock",
        ] {
            assert_eq!(pid(other), None, "{other}");
        }
    }

    #[test]
    fn removal_happens_once() {
        let scratch = Scratch::new("remove");
        let path = scratch.0.join("a.sock");
        std::fs::write(&path, b"").unwrap();
        let other = scratch.0.join("b.sock");
        std::fs::write(&other, b"").unwrap();
        // A registry of its own: the process-wide one holds other tests' sockets.
        let served = Served::default();
        let first = served.register(&path);
        let token = served.register(&other);
        served.remove(&other, token + 1);
        assert!(other.exists(), "removed with another server's token");
        served.remove(&other, token);
        assert!(!other.exists());
        assert_eq!(served.remove_all(), 1);
        assert!(!path.exists());
        assert_eq!(served.remove_all(), 0);
        // Bound again by someone else: a late `remove` leaves it alone.
        std::fs::write(&path, b"").unwrap();
        served.remove(&path, first);
        assert!(path.exists());
        // Bound again by a server of this process: only its own guard removes it.
        let second = served.register(&path);
        served.remove(&path, first);
        assert!(path.exists());
        served.remove(&path, second);
        assert!(!path.exists());
    }
}
