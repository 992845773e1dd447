//! Stack dumps of this process's Python threads, even when Python is stuck.
//!
//! At start a Python process registers `faulthandler` on [`STACK_SIGNAL`], writing to
//! the write end of a pipe made here ([`faulthandler_fd`]). A dump raises the signal in
//! this process and reads the pipe until it is quiet: `faulthandler` writes from the
//! signal handler itself, without the GIL, so a thread that holds the GIL forever does
//! not stop it. When `py-spy` is on `PATH`, `py-spy dump --pid` is tried first (with a
//! timeout); it needs permission to trace this process.

use hyperactor::sync::Mutex;
use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{StackDump, StackError};

/// The signal `faulthandler` is registered on (not used elsewhere in Monarch).
pub const STACK_SIGNAL: i32 = libc::SIGUSR2;

/// How long the pipe must stay quiet, once something came, for a dump to be complete.
const QUIET: Duration = Duration::from_millis(150);

struct Pipe {
    read: Mutex<std::fs::File>,
    write: RawFd,
}

fn pipe() -> Result<&'static Pipe, StackError> {
    static PIPE: OnceLock<Result<Pipe, StackError>> = OnceLock::new();
    PIPE.get_or_init(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(StackError::Pipe(
                std::io::Error::last_os_error().to_string(),
            ));
        }
        // A larger pipe holds a whole dump; a full pipe drops the rest (non-blocking
        // writes), so a signal handler never blocks. Failure leaves the default size.
        // SAFETY: a valid pipe descriptor.
        unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) };
        Ok(Pipe {
            // SAFETY: a fresh descriptor owned by nothing else.
            read: Mutex::new(unsafe { std::fs::File::from_raw_fd(fds[0]) }),
            write: fds[1],
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The write end of the pipe that `faulthandler` should write stack dumps to
/// (created on first call; it stays open for the life of the process).
///
/// # Errors
///
/// If the pipe cannot be created.
pub fn faulthandler_fd() -> Result<RawFd, StackError> {
    let fd = pipe()?.write;
    REGISTERED.get_or_init(|| ());
    Ok(fd)
}

static REGISTERED: OnceLock<()> = OnceLock::new();

fn py_spy(pid: u32, timeout: Duration) -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join("py-spy").is_file()))
        .unwrap_or(false);
    if !found {
        return None;
    }
    let mut child = std::process::Command::new("py-spy")
        .args(["dump", "--pid", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut text = String::new();
                child.stdout.take()?.read_to_string(&mut text).ok()?;
                return (status.success() && !text.trim().is_empty()).then_some(text);
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn faulthandler(timeout: Duration) -> Result<String, StackError> {
    if REGISTERED.get().is_none() {
        return Err(StackError::NoHandler);
    }
    let pipe = pipe()?;
    let mut read = pipe.read.lock();
    let mut buf = [0u8; 64 << 10];
    // What an earlier, timed-out dump left behind.
    while matches!(read.read(&mut buf), Ok(n) if n > 0) {}
    // SAFETY: kill on this very process with a signal whose handler Python installed.
    if unsafe { libc::kill(libc::getpid(), STACK_SIGNAL) } != 0 {
        return Err(StackError::Signal {
            signal: STACK_SIGNAL,
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    let deadline = Instant::now() + timeout;
    let mut text = Vec::new();
    let mut last_data = None;
    loop {
        match read.read(&mut buf) {
            Ok(n) if n > 0 => {
                text.extend_from_slice(&buf[..n]);
                last_data = Some(Instant::now());
                continue;
            }
            _ => {}
        }
        let now = Instant::now();
        if last_data.is_some_and(|t| now.duration_since(t) >= QUIET) || now >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if text.is_empty() {
        return Err(StackError::NoDump { timeout });
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Dumps the stacks of every thread of this process (blocking: call it from a blocking
/// thread), as the proc `proc`.
///
/// # Errors
///
/// If neither `py-spy` nor `faulthandler` gives a dump within `timeout`.
pub fn dump_self(proc: &str, timeout: Duration) -> Result<StackDump, StackError> {
    let pid = std::process::id();
    let (method, text) = match py_spy(pid, timeout) {
        Some(text) => ("py-spy", text),
        None => ("faulthandler", faulthandler(timeout)?),
    };
    Ok(StackDump {
        proc: proc.to_string(),
        pid,
        method: method.to_string(),
        text,
    })
}
